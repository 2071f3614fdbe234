"""actions/setup-python, locally: a fresh venv of the host's python<version>, first on PATH."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

version = os.environ["INPUT_PYTHON_VERSION"].strip()
python = shutil.which(f"python{version}")
if python is None:
    sys.exit(f"setup-python stand-in: this host has no python{version} on PATH")
env_dir = Path(os.environ["RUNNER_TEMP"]) / f"setup-python-{version}"
shutil.rmtree(env_dir, ignore_errors=True)
subprocess.run([python, "-m", "venv", str(env_dir)], check=True)
with open(os.environ["GITHUB_PATH"], "a") as path_file:
    path_file.write(f"{env_dir / 'bin'}\n")
print(f"fresh Python {version} ({python}) at {env_dir}")
