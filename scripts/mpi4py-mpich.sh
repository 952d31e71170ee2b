#!/usr/bin/env bash
# Builds mpi4py against MPICH, once, into target/mpi4py-mpich/site (or $1). Debian's
# python3-mpi4py is linked to Open MPI (libmpi.so.40), so mpi4py.bench cannot run under
# MPICH with Debian's packages; crates/e2e/tests/cluster.rs runs it with this build
# (PYTHONPATH=target/mpi4py-mpich/site). The sdist (with its pre-generated C, no Cython
# needed) comes from PyPI; MPICC=mpicc.mpich makes it MPICH's. About 80 s of CPU on the
# project's machine. Needs python3-dev, python3-pip, python3-setuptools, python3-wheel and
# mpich. docs/guide/mpi.md, "mpi4py under MPICH".
set -euo pipefail
cd "$(dirname "$0")/.."
version=3.1.6
# Debian's interpreter, the one the tests run (a python3 earlier on PATH may be another).
py=/usr/bin/python3
dest=${1:-target/mpi4py-mpich}
if [ -f "$dest/site/.built-$version" ]; then
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest/src"
"$py" -m pip download --quiet --no-deps --no-binary :all: "mpi4py==$version" -d "$dest/src"
MPICC=mpicc.mpich "$py" -m pip install --quiet --no-deps --no-build-isolation \
  --no-binary :all: --target "$dest/site" "$dest/src/mpi4py-$version.tar.gz"
# The build is MPICH's: its MPI module links libmpich, not Open MPI's libmpi.
ldd "$dest"/site/mpi4py/MPI.*.so | grep libmpich >/dev/null
touch "$dest/site/.built-$version"
echo "mpi4py $version for MPICH in $dest/site"
