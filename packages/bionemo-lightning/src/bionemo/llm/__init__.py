"""Compatibility package: the import paths of NVIDIA bionemo-llm, served by the bionemo-* packages."""
