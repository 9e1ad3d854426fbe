"""Turn the verbose pip/cmake/ninja build log on stdin into one live progress line."""

import re
import sys
import time

STEP = re.compile(r"\[(\d+)/(\d+)\]")


def main() -> None:
    start = time.monotonic()
    tty = sys.stdout.isatty()
    last_print = 0.0
    stage = "configuring"
    for line in sys.stdin:
        if "vulkan-shaders-gen" in line and "Performing" in line:
            stage = "vulkan shader generator"
        m = STEP.search(line)
        if m:
            done, total = int(m.group(1)), int(m.group(2))
            stage = f"compiling {done}/{total} ({100 * done // max(total, 1)}%)"
        now = time.monotonic()
        if now - last_print >= (0.5 if tty else 30.0):
            last_print = now
            elapsed = int(now - start)
            msg = f"[build] {elapsed // 60:02d}:{elapsed % 60:02d} {stage}"
            if tty:
                sys.stdout.write("\r" + msg.ljust(70))
            else:
                sys.stdout.write(msg + "\n")
            sys.stdout.flush()
    elapsed = int(time.monotonic() - start)
    sys.stdout.write(("\n" if tty else "") + f"[build] finished after {elapsed // 60}m{elapsed % 60:02d}s\n")


if __name__ == "__main__":
    main()
