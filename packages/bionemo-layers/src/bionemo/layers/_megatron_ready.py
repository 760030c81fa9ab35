"""Imported first by :mod:`bionemo.layers`: lets megatron-core import on machines with nvcc but no GPU."""

from bionemo.core.megatron_env import prepare_megatron_import

prepare_megatron_import()
