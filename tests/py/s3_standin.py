"""s3_standin.py - a small S3-compatible object store on 127.0.0.1 for the tests (test_s3_repository.py).

It answers what a model repository sync asks: ListObjectsV2 (`GET /BUCKET?list-type=2&prefix=P`,
paged by `max_keys` with continuation tokens) and GetObject (`GET /BUCKET/KEY`), path-style, and
checks every request's AWS Signature Version 4 with its own implementation (Python's hmac and
hashlib, written from AWS's documentation), answering 403 SignatureDoesNotMatch / InvalidAccessKeyId
in S3's XML error shape otherwise. Faults for the tests: `lie_etag` (a wrong ETag for one key),
`fail_get` (500 for one key). Requests are recorded in `log` (method, path, query).
"""
import hashlib
import hmac
import http.server
import threading
import urllib.parse
from xml.sax.saxutils import escape


def _sign(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _enc(s, keep_slash):
    return urllib.parse.quote(s, safe="-_.~" + ("/" if keep_slash else ""))


class S3Standin:
    def __init__(self, access_key="AKIDTEST", secret="s3cr3t/KEY+x", region="us-east-1", max_keys=1000):
        self.access_key, self.secret, self.region = access_key, secret, region
        self.max_keys = max_keys
        self.buckets = {}      # bucket -> {key: bytes}
        self.lie_etag = set()  # keys answered with a wrong ETag in listings
        self.fail_get = set()  # keys whose GetObject answers 500
        self.log = []
        self.lock = threading.Lock()
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                standin._handle(self)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def put(self, bucket, key, data):
        with self.lock:
            self.buckets.setdefault(bucket, {})[key] = data

    def delete(self, bucket, key):
        with self.lock:
            self.buckets.get(bucket, {}).pop(key, None)

    # --------------------------------------------------------------- requests
    def _reply(self, h, code, body, ctype="application/xml"):
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _error(self, h, code, s3code, msg):
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{s3code}</Code>'
                f"<Message>{escape(msg)}</Message></Error>").encode()
        self._reply(h, code, body)

    def _check_sig(self, h, path, query):
        auth = h.headers.get("Authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return "AccessDenied", "anonymous access is not allowed"
        parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
        cred = parts.get("Credential", "").split("/")
        if len(cred) != 5 or cred[0] != self.access_key:
            return "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
        date, region, service, term = cred[1:]
        amz_date = h.headers.get("x-amz-date", "")
        if region != self.region or service != "s3" or term != "aws4_request" or not amz_date.startswith(date):
            return "AuthorizationHeaderMalformed", "bad credential scope"
        signed = parts.get("SignedHeaders", "").split(";")
        if "host" not in signed or "x-amz-date" not in signed:
            return "AccessDenied", "host and x-amz-date must be signed"
        pairs = sorted((urllib.parse.unquote(k), urllib.parse.unquote(v)) for k, _, v in
                       (q.partition("=") for q in query.split("&") if q))
        cq = "&".join(f"{_enc(k, False)}={_enc(v, False)}" for k, v in pairs)
        ch = "".join(f"{n}:{(h.headers.get(n) or '').strip()}\n" for n in signed)
        payload = h.headers.get("x-amz-content-sha256", "")
        canon = "\n".join(["GET", _enc(urllib.parse.unquote(path), True), cq, ch, ";".join(signed), payload])
        scope = f"{date}/{region}/s3/aws4_request"
        sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canon.encode()).hexdigest()])
        k = _sign(("AWS4" + self.secret).encode(), date)
        for part in (region, "s3", "aws4_request"):
            k = _sign(k, part)
        want = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, parts.get("Signature", "")):
            return "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided."
        return None

    def _handle(self, h):
        u = urllib.parse.urlsplit(h.path)
        with self.lock:
            self.log.append(("GET", u.path, u.query))
        bad = self._check_sig(h, u.path, u.query)
        if bad:
            return self._error(h, 403, *bad)
        segs = u.path.lstrip("/").split("/", 1)
        bucket = urllib.parse.unquote(segs[0])
        with self.lock:
            objs = dict(self.buckets.get(bucket, {})) if bucket in self.buckets else None
        if objs is None:
            return self._error(h, 404, "NoSuchBucket", "The specified bucket does not exist")
        if len(segs) == 1 or segs[1] == "":
            q = dict(urllib.parse.parse_qsl(u.query, keep_blank_values=True))
            if q.get("list-type") != "2":
                return self._error(h, 400, "InvalidArgument", "only ListObjectsV2 here")
            prefix = q.get("prefix", "")
            keys = sorted(k for k in objs if k.startswith(prefix))
            start = int(q["continuation-token"][2:]) if q.get("continuation-token", "").startswith("ct") else 0
            page = keys[start:start + self.max_keys]
            more = start + len(page) < len(keys)
            items = []
            for k in page:
                etag = hashlib.md5(objs[k]).hexdigest()
                if k in self.lie_etag:
                    etag = hashlib.md5(objs[k] + b"x").hexdigest()
                items.append(f"<Contents><Key>{escape(k)}</Key><ETag>&quot;{etag}&quot;</ETag>"
                             f"<Size>{len(objs[k])}</Size><StorageClass>STANDARD</StorageClass></Contents>")
            body = ('<?xml version="1.0" encoding="UTF-8"?>'
                    '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                    f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount>"
                    f"<MaxKeys>{self.max_keys}</MaxKeys><IsTruncated>{'true' if more else 'false'}</IsTruncated>"
                    + (f"<NextContinuationToken>ct{start + len(page)}</NextContinuationToken>" if more else "")
                    + "".join(items) + "</ListBucketResult>").encode()
            return self._reply(h, 200, body)
        key = urllib.parse.unquote(segs[1])
        if key in self.fail_get:
            return self._error(h, 500, "InternalError", "We encountered an internal error. Please try again.")
        if key not in objs:
            return self._error(h, 404, "NoSuchKey", "The specified key does not exist.")
        self._reply(h, 200, objs[key], "application/octet-stream")
