"""Small shared helpers of the example scripts (argument parsing, printing)."""
import argparse
import os


def parser(description, out_default):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=out_default, help="folder for the figures")
    return p


def ensure_out(path):
    os.makedirs(path, exist_ok=True)
    return path


def print_checks(results):
    for c in results:
        print(f"  [{'PASS' if c.passed else 'FAIL'}] {c.name}: {c.value:.4g} {c.comparison} {c.threshold:.4g}")
