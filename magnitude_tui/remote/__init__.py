"""remote package: an EngineClient for OpenAI-compatible servers (vLLM, SGLang, llama-server)."""
