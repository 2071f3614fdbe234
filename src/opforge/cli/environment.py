"""The environment variables every opforge command checks first, each with the check of the
feature that reads it (``opforge.envvars`` runs them)."""

from __future__ import annotations

from opforge import envvars
from opforge.bisect.cache import check_size_variable
from opforge.compiler_cache import check_switch_variable
from opforge.matrix.model import check_channel_variable
from opforge.torchsource import check_index_variable
from opforge.venv import check_installer_variable

CHECKS: dict[str, envvars.Check] = {
    "OPFORGE_INSTALLER": check_installer_variable,
    "OPFORGE_TORCH_INDEX": check_index_variable,
    "OPFORGE_COMPILER_CACHE": check_switch_variable,
    "OPFORGE_CACHE_MAX_SIZE": check_size_variable,
    "OPFORGE_CACHE_DIR": envvars.check_folder_variable,
    "OPFORGE_TORCH_CHANNEL": check_channel_variable,
}


def check_environment() -> None:
    """Every opforge variable that is set, checked; the first bad one is a UsageError."""
    envvars.check_environment(CHECKS)
