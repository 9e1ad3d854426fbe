"""The engine: the step loop (core), its worker process and the client the app talks to."""
