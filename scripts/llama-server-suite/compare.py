#!/usr/bin/env python3
"""Compares two JUnit reports of llama.cpp's server suite (run.sh): the reference (llama-server) and
specd. Counts only the tests the reference passes; lists those specd fails, with the first line of
each failure."""
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    res = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if case.find("skipped") is not None:
            res[name] = ("skipped", "")
        elif bad is not None:
            msg = (bad.get("message") or bad.text or "").strip().splitlines()
            res[name] = ("failed", msg[0][:200] if msg else "")
        else:
            res[name] = ("passed", "")
    return res


ref, ours = outcomes(sys.argv[1]), outcomes(sys.argv[2])
bar = sorted(n for n, (o, _) in ref.items() if o == "passed")
failed = [n for n in bar if ours.get(n, ("missing", ""))[0] != "passed"]
for n in failed:
    o, msg = ours.get(n, ("missing", ""))
    print(f"{o:7} {n}  {msg}")
print(f"specd passes {len(bar) - len(failed)} of the {len(bar)} tests llama-server passes "
      f"({len(ref)} run; {len(ref) - len(bar)} fail or skip on llama-server with these models)")
