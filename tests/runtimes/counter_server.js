// An HTTP server for crates/ferry/tests/runtimes.rs (`node
// counter_server.js PORT`). It listens on [::], dual-stack, and keeps a
// counter in memory: every GET /count adds one and answers the new value,
// so a restored server that lost its memory answers a lower number.
// GET /hello answers without counting. Connections are kept alive with no
// idle timeout, so a client's connection stays open across a checkpoint.
'use strict';
const http = require('http');

const port = Number(process.argv[2]);
let count = 0;
const server = http.createServer((req, res) => {
  let body;
  if (req.url === '/count') {
    count += 1;
    body = `${count}\n`;
  } else if (req.url === '/hello') {
    body = 'hello\n';
  } else {
    res.writeHead(404, { 'Content-Length': 0 });
    res.end();
    return;
  }
  res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
});
server.keepAliveTimeout = 0;
server.headersTimeout = 0;
server.requestTimeout = 0;
server.listen({ port, host: '::', ipv6Only: false }, () => {
  console.log(`listening on ${JSON.stringify(server.address())}`);
});
