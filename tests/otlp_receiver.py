# SPDX-License-Identifier: MIT
"""A minimal OTLP/HTTP JSON receiver for tests/cli_otlp.sh: accepts POST
/v1/traces on a free loopback port (written to PORT_FILE), stores each body as
capture-N.json in OUT_DIR, answers 200 with an empty ExportTraceServiceResponse.
It exits by itself after MAX_SECONDS."""
import http.server
import json
import os
import sys
import threading

out_dir, port_file, max_seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
count = 0
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        global count
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        ok = self.path == "/v1/traces" and self.headers.get("Content-Type", "").startswith("application/json")
        try:
            json.loads(body)
        except ValueError:
            ok = False
        if ok:
            with lock:
                count += 1
                path = os.path.join(out_dir, "capture-%d.json" % count)
            with open(path + ".tmp", "wb") as f:
                f.write(body)
            os.rename(path + ".tmp", path)
        reply = b"{}" if ok else b'{"error":"expected a JSON POST to /v1/traces"}'
        self.send_response(200 if ok else 400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
threading.Timer(max_seconds, server.shutdown).start()
server.serve_forever()
