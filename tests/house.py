#!/usr/bin/env python3
"""Checks that the source tree keeps the shape docs/design.md draws.

  tests/house.py [BUILD]      (BUILD: the build folder whose objects to read)

Each check prints "ok - ..." or "not ok - ...", then one closing line
"house: N passed, M failed"; the exit status is 1 when any check failed.

- includes between folders point down the layers (LAYERS below);
- a folder's private header (*_i.h) is included only from that folder;
- calls between folders point down too, and the calls between the files
  of one folder form no circle (read from the objects with nm: a symbol a
  file defines and another file uses);
- no C file is longer than MAX_LINES;
- helpers the project keeps once are not written again (DEFINED_ONCE).

Tests, benchmarks and the CUDA stand-ins (tests/) are outside the house:
white-box unit tests may include a module's private header.
"""
import os
import re
import subprocess
import sys

# Each folder and the folders it may use (include or call), lowest first.
LAYERS = {
    "meta": set(),
    "tier": {"meta"},
    "hcache": {"meta", "tier"},
    "gpu": {"meta", "tier", "hcache"},
    "cache": {"meta", "tier", "hcache", "gpu"},
    "fs": {"meta", "tier", "hcache", "gpu", "cache"},
    "sim": {"meta", "tier", "cache"},
    "client": {"meta"},
    "mkfs": {"meta"},
}
MAX_LINES = 1500
# Helpers the project keeps in one place: a pattern, and how many lines of
# the product's sources may match it.
DEFINED_ONCE = {
    "container_of": (r"^\s*#\s*define\s+container_of\b", 1),
    "CUDA_TRY": (r"^\s*#\s*define\s+CUDA_TRY\b", 1),
    # meta/fmt.h has kvfs_fmt_dtype_size()
    "a private dtype size table": (r"^static\s+size_t\s+dtype_size\s*\(", 0),
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
top = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
build = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BUILD", "build")
results = []


def check(ok, what):
    results.append(ok)
    print(("ok - " if ok else "not ok - ") + what)


def sources():
    for folder in sorted(LAYERS):
        d = os.path.join(top, folder)
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            if f.endswith((".c", ".h", ".cu")):
                yield folder, os.path.join(folder, f)


def read(rel):
    with open(os.path.join(top, rel), errors="replace") as fh:
        return fh.read()


def find_cycle(edges):
    """One circle in the graph @edges (node -> set of nodes), or None."""
    state = {}
    stack = []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                c = visit(w)
                if c:
                    return c
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(edges):
        if v not in state:
            c = visit(v)
            if c:
                return c
    return None


# -- includes ---------------------------------------------------------------
bad_inc, bad_priv, long_files = [], [], []
once = {name: [] for name in DEFINED_ONCE}
for folder, rel in sources():
    text = read(rel)
    for inc in INCLUDE.findall(text):
        tf = os.path.dirname(inc)
        if not tf or tf == folder:
            continue
        if tf in LAYERS and tf not in LAYERS[folder]:
            bad_inc.append("%s includes %s" % (rel, inc))
        if inc.endswith("_i.h"):
            bad_priv.append("%s includes %s" % (rel, inc))
    if rel.endswith((".c", ".cu")):
        n = text.count("\n")
        if n > MAX_LINES:
            long_files.append("%s has %d lines" % (rel, n))
    for name, (pat, _) in DEFINED_ONCE.items():
        for line in text.splitlines():
            if re.match(pat, line):
                once[name].append(rel)
check(not bad_inc, "includes between folders point down the layers" +
      "".join("\n#   " + b for b in bad_inc))
check(not bad_priv, "private headers are included only from their folder" +
      "".join("\n#   " + b for b in bad_priv))
check(not long_files, "no C file is longer than %d lines" % MAX_LINES +
      "".join("\n#   " + b for b in long_files))
for name, where in sorted(once.items()):
    most = DEFINED_ONCE[name][1]
    check(len(where) <= most, "%s is written %s%s" %
          (name, "once" if most else "nowhere",
           "" if len(where) <= most else " (it is in %s)" % ", ".join(where)))

# -- calls, from the objects ------------------------------------------------
objs = []
for folder in sorted(LAYERS):
    d = os.path.join(top, build, "obj", folder)
    if os.path.isdir(d):
        objs += [os.path.join(folder, f[:-2]) for f in sorted(os.listdir(d))
                 if f.endswith(".o")]
# Only objects whose source still exists (a build folder may hold the
# object of a file since moved).
objs = [o for o in objs
        if os.path.exists(os.path.join(top, o + ".c")) or
        os.path.exists(os.path.join(top, o + ".cu"))]
if not objs:
    check(False, "objects to read in %s/obj (build first)" % build)
else:
    defs, uses = {}, {}
    for o in objs:
        out = subprocess.run(["nm", os.path.join(top, build, "obj", o + ".o")],
                             capture_output=True, text=True).stdout
        uses[o] = set()
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDBR":
                defs.setdefault(p[2], o)
            elif len(p) == 2 and p[0] == "U":
                uses[o].add(p[1])
    edges, bad_call = {}, []
    for o, us in uses.items():
        fo = os.path.dirname(o)
        for u in us:
            d = defs.get(u)
            if not d or d == o:
                continue
            fd = os.path.dirname(d)
            if fd == fo:
                edges.setdefault(o, set()).add(d)
            elif fd not in LAYERS[fo]:
                bad_call.append("%s calls %s (%s)" % (o, u, d))
    check(not bad_call, "calls between folders point down the layers" +
          "".join("\n#   " + b for b in sorted(bad_call)[:20]))
    # Program entry points (*_main) call into their folder from above.
    cyc = find_cycle({k: {w for w in v if not w.endswith("_main")}
                      for k, v in edges.items() if not k.endswith("_main")})
    check(cyc is None, "the files of each folder call each other in one "
          "direction" + ("" if cyc is None else
                         "\n#   circle: " + " -> ".join(cyc)))

failed = results.count(False)
print("house: %d passed, %d failed" % (len(results) - failed, failed))
sys.exit(1 if failed else 0)
