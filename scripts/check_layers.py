#!/usr/bin/env python3
"""Fails when the engine's layering is broken (docs/ARCHITECTURE.md, "Layers").

The order is DSCPP_LAYERS in CMakeLists.txt, bottom to top, with the application (cli/) above them all. A file
of layer L (src/L/, include/dscpp/L/, cli/) may include only headers of L or of layers below it, and
src/L/CMakeLists.txt may link only libraries of layers below L. A private header (src/L/) is L's own: public headers
and other layers may not include it, except core's CUDA runtime (src/core/cuda/), which the CUDA code of every layer
shares. Every folder under src/ must be a layer of the list. Some layers' places are fixed whatever else moves
(PLACES): autotune, which plans runs with the runtime's config and estimates and starts them through the launcher,
sits above both.

usage: scripts/check_layers.py [--root DIR]   (standard library only; CTest runs it as check_layers)
"""
import argparse
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
LINK = re.compile(r'\bdscpp_(\w+)')
SOURCES = {'.h', '.hpp', '.cpp', '.cu', '.cuh'}
APP = 'cli'
SHARED_PRIVATE = 'src/core/cuda/'  # private headers other layers may include
PLACES = {'autotune': ('runtime', 'launcher')}  # a layer -> the layers it must sit above, where both exist


def layer_order(root):
    m = re.search(r'set\(DSCPP_LAYERS\s+([^)]*)\)', (root / 'CMakeLists.txt').read_text())
    if not m:
        sys.exit('check_layers: no set(DSCPP_LAYERS ...) in CMakeLists.txt')
    return m.group(1).split() + [APP]


def layer_of(root, path):
    """(layer, public) of a file under root, or (None, False) outside the engine and the application."""
    parts = path.relative_to(root).parts
    if parts[0] == 'src' and len(parts) > 2:
        return parts[1], False
    if parts[:2] == ('include', 'dscpp') and len(parts) > 3:
        return parts[2], True
    if parts[0] == APP:
        return APP, False
    return None, False


def resolve(root, src, name):
    """The file an include names, searched as the build does: beside the includer, then include/, src/, the root."""
    for base in (src.parent, root / 'include', root / 'src', root):
        cand = base / name
        if cand.is_file():
            return cand.resolve()
    return None  # a system or third-party header


def check(root):
    order = layer_order(root)
    rank = {layer: i for i, layer in enumerate(order)}
    errors = []
    for layer, below in PLACES.items():
        for b in below:
            if layer in rank and b in rank and rank[b] > rank[layer]:
                errors.append(f'CMakeLists.txt: DSCPP_LAYERS puts {layer} below {b}; it must sit above {b}')
    for d in sorted((root / 'src').iterdir()):
        if d.is_dir() and d.name not in rank:
            errors.append(f'{d.relative_to(root)}: folder is not a layer (add it to DSCPP_LAYERS in CMakeLists.txt)')
    files = [p for top in ('src', 'include/dscpp', APP) for p in sorted((root / top).rglob('*'))
             if p.suffix in SOURCES and p.is_file()]
    for f in files:
        layer, public = layer_of(root, f)
        if layer not in rank:
            continue  # reported above as a folder that is not a layer
        for n, line in enumerate(f.read_text(errors='replace').splitlines(), 1):
            m = INCLUDE.match(line)
            target = m and resolve(root, f, m.group(1))
            if not target:
                continue
            to, to_public = layer_of(root, target)
            where = f'{f.relative_to(root)}:{n}'
            if to in rank and rank[to] > rank[layer]:
                errors.append(f'{where}: {layer} includes {m.group(1)} of {to}, a layer above it')
            elif to is not None and not to_public and (public or to != layer):
                rel = target.relative_to(root).as_posix()
                if public or not rel.startswith(SHARED_PRIVATE):
                    errors.append(f'{where}: {"public header of " if public else ""}{layer} includes {rel}, '
                                  f'private to {to}')
    for layer in order[:-1]:
        cmake = root / 'src' / layer / 'CMakeLists.txt'
        if not cmake.is_file():
            errors.append(f'{cmake.relative_to(root)}: missing (every layer builds its own library)')
            continue
        lines = [line.split('#')[0] for line in cmake.read_text().splitlines()]
        for n, line in enumerate(lines, 1):
            for dep in LINK.findall(line):
                if dep in rank and rank[dep] > rank[layer]:
                    errors.append(f'{cmake.relative_to(root)}:{n}: {layer} links dscpp_{dep}, not a layer below it')
        for call in re.findall(r'dscpp_layer\(([^)]*)\)', '\n'.join(lines)):
            name, *deps = call.split()
            for dep in deps:
                if dep != 'DEPS' and (name != layer or dep not in rank or rank[dep] >= rank[layer]):
                    errors.append(f'{cmake.relative_to(root)}: dscpp_layer({name}) in {layer}\'s folder depends on '
                                  f'{dep}, not a layer below {layer}')
    return order, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--root', type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent)
    root = ap.parse_args().root.resolve()
    order, errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f'check_layers: {len(errors)} violation(s) of the layer order {" < ".join(order)}')
        return 1
    print(f'check_layers: ok ({" < ".join(order)})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
