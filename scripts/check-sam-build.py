#!/usr/bin/env python3
"""Checks a `sam build` output: every function of the built template has an arm64 (aarch64) ELF
`bootstrap`, as the provided.al2023 runtime on Graviton runs it. Usage: check-sam-build.py BUILD_DIR"""
import pathlib
import sys

build = pathlib.Path(sys.argv[1])
template = (build / "template.yaml").read_text()
functions = [line.split(":")[0].strip() for line in template.splitlines()
             if line.startswith("  ") and not line.startswith("   ") and line.strip().endswith("Function:")
             and line.strip() != "Function:"]
if len(functions) < 4:
    sys.exit(f"check-sam-build: found only {functions} in {build}/template.yaml")
for name in functions:
    boot = build / name / "bootstrap"
    if not boot.is_file():
        sys.exit(f"check-sam-build: {boot} is missing")
    head = boot.read_bytes()[:20]
    if head[:4] != b"\x7fELF" or int.from_bytes(head[18:20], "little") != 183:
        sys.exit(f"check-sam-build: {boot} is not an aarch64 ELF executable")
    print(f"check-sam-build: {name}: {boot.stat().st_size} bytes, aarch64")
