"""Starts `dscpp serve` on the tiny model serve_fixture writes, for test_serve.py and test_serve_openai.py.

    with Served(args) as s:  s.url, s.model_dir, s.dscpp; on exit SIGTERM, and the exit status must be 0.
"""
import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument('--dscpp', required=True)
    p.add_argument('--fixture', required=True)
    return p.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, args, extra=()):
        self.args, self.extra = args, list(extra)

    def __enter__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix='dscpp_serve_')
        self.model_dir = os.path.join(self.tmp.name, 'tiny')
        subprocess.run([self.args.fixture, self.model_dir], check=True, stdout=subprocess.DEVNULL)
        self.dscpp = self.args.dscpp
        self.port = free_port()
        self.url = f'http://127.0.0.1:{self.port}'
        self.log = open(os.path.join(self.tmp.name, 'serve.log'), 'w+')
        self.proc = subprocess.Popen([self.dscpp, 'serve', '--hf', self.model_dir, '--port', str(self.port),
                                      '--served-model-name', 'tiny'] + self.extra,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(600):  # start-up is a model load: wait on the health endpoint, not a fixed time
            if self.proc.poll() is not None:
                raise RuntimeError('dscpp serve exited at start-up:\n' + self.server_log())
            try:
                if self.get('/health')[0] == 200:
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError('dscpp serve did not come up:\n' + self.server_log())

    def server_log(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(timeout=120)
            if exc[0] is None and rc != 0:
                raise AssertionError(f'dscpp serve exited {rc} after SIGTERM:\n' + self.server_log())
        self.log.close()
        self.tmp.cleanup()

    def request(self, method, path, body=None, raw=None, headers=None):
        c = http.client.HTTPConnection('127.0.0.1', self.port, timeout=300)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=headers or {'Content-Type': 'application/json'})
        r = c.getresponse()
        out = (r.status, r.read(), dict(r.getheaders()))
        c.close()
        return out

    def get(self, path):
        return self.request('GET', path)

    def post(self, path, body):
        status, data, _ = self.request('POST', path, body)
        return status, json.loads(data)

    def metrics(self):
        text = self.get('/metrics')[1].decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith('#'):
                name, value = line.rsplit(' ', 1)
                out[name.split('{')[0] + ('' if 'finished_reason' not in name else
                                          ':' + name.split('finished_reason="')[1].split('"')[0])] = float(value)
        return out
