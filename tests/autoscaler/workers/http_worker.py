"""A stand-in worker for local-mode tests: serves /v2/health/ready on --port and spawns a child.

The child (a sleeping process) stands for anything a real worker starts (a model server's
helpers); its pid goes to --child-pid-file so tests can check that stopping the worker leaves no
orphan. --ignore-sigterm makes a worker that must be killed.
"""

import argparse
import os
import signal
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--child-pid-file")
parser.add_argument("--ignore-sigterm", action="store_true")
args = parser.parse_args()
assert os.environ["PORT"] == str(args.port)

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
if args.child_pid_file:
    with open(args.child_pid_file, "a") as f:
        f.write(f"{child.pid}\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format, *a):
        pass

    def do_GET(self):
        code = 200 if self.path == "/v2/health/ready" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
if args.ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:
    server.serve_forever()
finally:
    server.server_close()
