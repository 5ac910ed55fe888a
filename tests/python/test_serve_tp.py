#!/usr/bin/env python3
"""`dscpp serve --tensor-parallel-size 2` on the CPU, standard library only: run by hand (no `dscpp launch`), the
server starts its own two ranks (rank 0 serves HTTP, rank 1 follows its steps); greedy completions, streamed and
not, equal `dscpp generate`'s on one rank; seeded sampling repeats; SIGTERM with a stream in flight drains it and
every rank exits 0.

usage: test_serve_tp.py --dscpp BUILD/dscpp --fixture BUILD/tests/serve_fixture   (exit 77: no Gloo in this build)
"""
import sys

from serve_harness import Served, parse_args
from test_serve import check_basics, check_sampling, sigterm_with_stream_in_flight


def main():
    args = parse_args()
    try:
        with Served(args, ['--tensor-parallel-size', '2']) as s:
            check_basics(s)
            check_sampling(s)
            sigterm_with_stream_in_flight(s)
    except RuntimeError as e:
        if 'the gloo backend is not in this build' in str(e):
            print('test_serve_tp: skipped (no Gloo in this build)')
            return 77
        raise
    print('test_serve_tp: ok')


if __name__ == '__main__':
    sys.exit(main())
