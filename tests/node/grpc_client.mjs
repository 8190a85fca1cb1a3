// A real gRPC client for Sampan's KServe v2 gRPC service (tests/py/test_grpc.py
// and the gRPC benchmark), built on @grpc/grpc-js with proto/grpc_service.proto
// loaded at run time by @grpc/proto-loader.
//
//   node grpc_client.mjs < calls.json > results.json
//
// Input: {"addr": "127.0.0.1:8001", "ca": "ca.pem" (optional: TLS), "calls": [...]}.
// Each call is run in order and gives one result line in a JSON array:
//   {"method": "ModelInfer", "request": {...}, "metadata": {"authorization": "Bearer k"},
//    "deadline_ms": 10000}                       unary: {code, details, response}
//   {"method": "ModelInfer", "raw": "<base64>"}  unary with these message bytes (malformed)
//   {"method": "ModelStreamInfer", "requests": [...]}     bidi: {code, details, responses}
//       ("cancel_after_responses": N cancels the call after N responses, without half-closing)
//   {"h2": {"path": ..., "headers": {...}, "body": "<base64>"}}  raw HTTP/2 (broken frames):
//                                                {status, headers, trailers, body}
//   {"bench": {"method": "ModelInfer", "request": {...}, "concurrency": 8, "seconds": 5}}
//                                                closed loop: {n, errors, rps, p50_ms, p99_ms}
// Bytes fields (raw_input_contents, bytes_contents, ...) are given and returned as base64.
import fs from 'node:fs';
import http2 from 'node:http2';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const here = path.dirname(fileURLToPath(import.meta.url));
const protoPath = path.join(here, '..', '..', 'proto', 'grpc_service.proto');
const def = protoLoader.loadSync(protoPath, {
  includeDirs: [path.dirname(protoPath)], // model_config.proto, imported
  keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true, bytes: String,
});
const pkg = grpc.loadPackageDefinition(def).inference;

const input = JSON.parse(fs.readFileSync(0, 'utf8'));
const creds = input.ca
  ? grpc.credentials.createSsl(fs.readFileSync(input.ca))
  : grpc.credentials.createInsecure();
const options = { 'grpc.max_receive_message_length': 64 << 20, 'grpc.max_send_message_length': -1 };
const client = new pkg.GRPCInferenceService(input.addr, creds, options);

// base64 strings where the proto has bytes (proto-loader's `bytes: String` on the way out).
function toBytes(req) {
  if (!req) return req;
  const r = JSON.parse(JSON.stringify(req));
  if (r.raw_input_contents) r.raw_input_contents = r.raw_input_contents.map((b) => Buffer.from(b, 'base64'));
  for (const t of r.inputs || []) {
    if (t.contents && t.contents.bytes_contents) {
      t.contents.bytes_contents = t.contents.bytes_contents.map((b) => Buffer.from(b, 'base64'));
    }
  }
  return r;
}

function meta(m) {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(m || {})) md.set(k, v);
  return md;
}

function deadline(c) {
  return { deadline: Date.now() + (c.deadline_ms || 20000) };
}

function unary(c) {
  return new Promise((resolve) => {
    let headers = {}; // the response's initial metadata (x-request-id, traceparent)
    const done = (err, resp) => resolve(err
      ? { code: err.code, details: err.details, metadata: headers }
      : { code: 0, details: '', response: resp, metadata: headers });
    const keep = (call) => call.on('metadata', (m) => { headers = m.getMap(); });
    if (c.raw !== undefined) {
      const p = `/inference.GRPCInferenceService/${c.method}`;
      keep(client.makeUnaryRequest(p, (x) => x, (b) => ({ bytes: b.toString('base64') }),
        Buffer.from(c.raw, 'base64'), meta(c.metadata), deadline(c), done));
      return;
    }
    keep(client[c.method](toBytes(c.request), meta(c.metadata), deadline(c), done));
  });
}

function bidi(c) {
  return new Promise((resolve) => {
    const call = client.ModelStreamInfer(meta(c.metadata), deadline(c));
    const responses = [];
    call.on('data', (d) => {
      responses.push(d);
      if (c.cancel_after_responses && responses.length === c.cancel_after_responses) call.cancel();
    });
    call.on('error', (err) => resolve({ code: err.code, details: err.details, responses }));
    call.on('end', () => resolve({ code: 0, details: '', responses }));
    for (const r of c.requests) call.write(toBytes(r));
    if (!c.cancel_after_responses) call.end();
  });
}

function raw(c) {
  return new Promise((resolve) => {
    const url = `${input.ca ? 'https' : 'http'}://${input.addr}`;
    const sess = http2.connect(url, input.ca ? { ca: fs.readFileSync(input.ca) } : {});
    const out = { headers: null, trailers: null, body: '' };
    const finish = (extra) => { sess.close(); resolve({ ...out, ...extra }); };
    sess.on('error', (e) => finish({ error: String(e.code || e) }));
    const h = { ':method': 'POST', ':path': c.h2.path, 'content-type': 'application/grpc', te: 'trailers', ...c.h2.headers };
    const req = sess.request(h, { endStream: false });
    const chunks = [];
    req.on('response', (hd) => { out.headers = hd; });
    req.on('trailers', (t) => { out.trailers = t; });
    req.on('data', (d) => chunks.push(d));
    req.on('error', (e) => finish({ error: String(e.code || e) }));
    req.on('close', () => { out.body = Buffer.concat(chunks).toString('base64'); out.rst = req.rstCode; finish({}); });
    req.setTimeout(c.timeout_ms || 20000, () => { req.close(); });
    if (c.h2.body) req.write(Buffer.from(c.h2.body, 'base64'));
    if (!c.h2.keep_open) req.end();
  });
}

async function bench(c) {
  const b = c.bench;
  const lat = [];
  let errors = 0;
  const end = Date.now() + b.seconds * 1000;
  const req = toBytes(b.request);
  const md = meta(b.metadata);
  const worker = async () => {
    while (Date.now() < end) {
      const t0 = process.hrtime.bigint();
      await new Promise((resolve) => client[b.method](req, md, { deadline: Date.now() + 10000 }, (err) => {
        if (err) errors++;
        else lat.push(Number(process.hrtime.bigint() - t0) / 1e6);
        resolve();
      }));
    }
  };
  const t0 = Date.now();
  await Promise.all(Array.from({ length: b.concurrency }, worker));
  const secs = (Date.now() - t0) / 1000;
  lat.sort((x, y) => x - y);
  const q = (p) => (lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] : 0);
  return { n: lat.length, errors, rps: lat.length / secs, p50_ms: q(0.5), p99_ms: q(0.99) };
}

const results = [];
for (const c of input.calls) {
  if (c.h2) results.push(await raw(c));
  else if (c.bench) results.push(await bench(c));
  else if (c.method === 'ModelStreamInfer') results.push(await bidi(c));
  else results.push(await unary(c));
}
client.close();
process.stdout.write(JSON.stringify(results, (k, v) => (Buffer.isBuffer(v) ? v.toString('base64') : v)));
process.stdout.write('\n');
