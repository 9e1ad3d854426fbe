"""Guard the one VK_EXT_layer_settings block in vendored ggml-vulkan so it builds with Vulkan headers < 1.3.272.

Debian 12 ships headers 1.3.239, which lack vk::LayerSettingEXT. The block only matters when the
validation layer is requested (a debug feature), so without the types we create the instance
without the layer-settings chain. Idempotent: a file already patched is left alone.
"""

import sys
from pathlib import Path

MARK = "/* magnitude-tui: VK_EXT_layer_settings guard */"
START = "    VkBool32 enable_best_practice = layer_settings;\n"
END = "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, &layer_setting_info);\n"
FALLBACK = "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);\n"


def patch(path: Path) -> str:
    text = path.read_text()
    if MARK in text:
        return "already patched"
    start = text.find(START)
    end = text.find(END, start)
    if start < 0 or end < 0:
        raise SystemExit(f"{path}: layer-settings block not found; the vendored source changed, update this patch")
    end += len(END)
    guarded = (
        f"{MARK}\n#if VK_HEADER_VERSION >= 272\n" + text[start:end] + "#else\n" + FALLBACK + "#endif\n"
    )
    path.write_text(text[:start] + guarded + text[end:])
    return "patched"


if __name__ == "__main__":
    root = Path(sys.argv[1])
    target = root / "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    print(f"{target}: {patch(target)}")
