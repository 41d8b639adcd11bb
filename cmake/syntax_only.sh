#!/bin/sh
# A compiler launcher (CXX_COMPILER_LAUNCHER) for code that only needs to compile: runs
# the compile command with -fsyntax-only — parsed, templates instantiated, every warning
# as the build's flags say — and touches the object file it would have written, so make
# sees it built. No code is generated: a fraction of the time (docs/benchmarks.md).
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
"$@" -fsyntax-only || exit $?
if [ -n "$out" ]; then
  mkdir -p "$(dirname "$out")" && touch "$out"
fi
