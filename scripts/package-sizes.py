#!/usr/bin/env python3
"""Prints each function's `bootstrap` size and its deployment zip size (deflate, as `sam deploy`
uploads it) from a `sam build` output. Usage: package-sizes.py BUILD_DIR"""
import io
import pathlib
import sys
import zipfile

build = pathlib.Path(sys.argv[1])
for boot in sorted(build.glob("*/bootstrap")):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(boot, "bootstrap")
    print(f"{boot.parent.name:28} bootstrap {boot.stat().st_size:>10} B   zip {len(buf.getvalue()):>10} B")
