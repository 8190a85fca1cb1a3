// A real client of the standard gRPC health service (grpc.health.v1.Health)
// for tests/py/test_tstats.py: @grpc/grpc-js with proto/health.proto loaded
// at run time by @grpc/proto-loader, as any health client would use it.
//
//   node health_client.mjs < calls.json > results.json
//
// Input: {"addr": "127.0.0.1:8001", "calls": [...]}, run in order, one result each:
//   {"check": "<service>", "metadata": {...}}          -> {code, details, status}
//   {"watch": "<service>", "until": "NOT_SERVING", "timeout_ms": 15000,
//    "on_first": {"url": ..., "method": "POST", "headers": {...}}}
//        -> {code, details, statuses: [...], http_status}
//     Watch: collect the streamed statuses until one equals `until` (or the
//     timeout), then cancel; after the first status, send the HTTP request
//     on_first (e.g. an unload) so that the stream can see the change.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const here = path.dirname(fileURLToPath(import.meta.url));
const def = protoLoader.loadSync(path.join(here, '..', '..', 'proto', 'health.proto'), {
  keepCase: true, longs: Number, enums: String, defaults: true,
});
const Health = grpc.loadPackageDefinition(def).grpc.health.v1.Health;
const input = JSON.parse(fs.readFileSync(0, 'utf8'));
const client = new Health(input.addr, grpc.credentials.createInsecure());

function meta(m) {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(m || {})) md.set(k, v);
  return md;
}

function check(c) {
  return new Promise((resolve) => {
    client.Check({ service: c.check }, meta(c.metadata), { deadline: Date.now() + 10000 },
      (err, resp) => resolve(err ? { code: err.code, details: err.details }
        : { code: 0, details: '', status: resp.status }));
  });
}

function watch(c) {
  return new Promise((resolve) => {
    const statuses = [];
    let httpStatus = null;
    let done = false;
    const call = client.Watch({ service: c.watch }, meta(c.metadata));
    const finish = (code, details) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      call.cancel();
      resolve({ code, details, statuses, http_status: httpStatus });
    };
    const timer = setTimeout(() => finish(-1, 'timeout'), c.timeout_ms || 15000);
    call.on('data', async (r) => {
      statuses.push(r.status);
      if (statuses.length === 1 && c.on_first) {
        const h = c.on_first;
        try {
          const res = await fetch(h.url, { method: h.method || 'POST', headers: h.headers || {} });
          httpStatus = res.status;
        } catch (e) {
          httpStatus = String(e);
        }
      }
      if (r.status === c.until) finish(0, '');
    });
    call.on('error', (e) => finish(e.code, e.details));
    call.on('end', () => finish(0, 'ended'));
  });
}

const results = [];
for (const c of input.calls) {
  results.push(c.watch !== undefined ? await watch(c) : await check(c));
}
client.close();
process.stdout.write(JSON.stringify(results));
process.stdout.write('\n');
