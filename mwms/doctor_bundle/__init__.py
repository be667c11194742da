"""The program `mwms doctor` submits: the CLI packs this directory as the doctor job's bundle.

The measurements are the preflight check's (mwms_runtime/preflight.py), which the doctor job turns on,
with a raw TCP stream added; the program itself only says that the check passed.
"""
