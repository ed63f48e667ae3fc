// A minimal stand-in for spaced in front of the code-interpreter server, so that the unmodified
// SDK can drive it: POST /v2/sandboxes, DELETE /sandboxes/{id}, the agent's GET /envs (with the
// envd token), and every request with `E2b-Sandbox-Port: 49999` passed on to the server as a
// stream. Like node's http and Go's ReverseProxy by default, it holds response headers until the
// first body byte (MOCK_FLUSH=1 flushes them at once). MOCK_CHOP=N re-chunks bodies into N-byte
// writes, as a slow network would deliver them. Loopback only.
// usage: node mock.mjs PORT CODE_SERVER_PORT
import http from 'node:http';
const [,, port, codePort] = process.argv;
const TOKEN = 'envd-token-123';
const srv = http.createServer((req, res) => {
  if (req.headers['e2b-sandbox-port'] === '49999') {
    const up = http.request({ host: '127.0.0.1', port: codePort, method: req.method, path: req.url, headers: req.headers }, (ur) => {
      res.writeHead(ur.statusCode, ur.headers);
      if (process.env.MOCK_FLUSH) res.flushHeaders();
      const chop = Number(process.env.MOCK_CHOP || 0);
      if (!chop) { ur.pipe(res); return; }
      // Re-chunk the body into tiny writes, as a slow network would deliver it.
      const pieces = [];
      let pumping = false, ended = false;
      const pump = () => {
        if (pieces.length === 0) { pumping = false; if (ended) res.end(); return; }
        pumping = true;
        res.write(pieces.shift());
        setTimeout(pump, 1);
      };
      ur.on('data', (buf) => {
        for (let i = 0; i < buf.length; i += chop) pieces.push(buf.subarray(i, i + chop));
        if (!pumping) pump();
      });
      ur.on('end', () => { ended = true; if (!pumping) res.end(); });
    });
    up.on('error', () => { res.writeHead(502); res.end('bad gateway'); });
    req.pipe(up);
    res.on('close', () => up.destroy());   // the client went away: so does the upstream request
    return;
  }
  let body = '';
  req.on('data', (c) => body += c);
  req.on('end', () => {
    if (req.method === 'POST' && /^\/(v2\/)?sandboxes$/.test(req.url)) {
      const b = JSON.parse(body || '{}');
      res.writeHead(201, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ sandboxID: 'sbxtest', clientID: 'c', templateID: b.templateID, envdVersion: '0.5.7', envdAccessToken: TOKEN, domain: null }));
    } else if (req.method === 'DELETE' && req.url.startsWith('/sandboxes/')) {
      res.writeHead(204); res.end();
    } else if (req.method === 'GET' && req.url === '/envs') {
      if (req.headers['x-access-token'] !== TOKEN) { res.writeHead(401); res.end(); return; }
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ SANDBOX_GLOBAL: 'from-envd' }));
    } else if (req.url.startsWith('/health')) {
      res.writeHead(204); res.end();
    } else {
      console.error('mock: unexpected', req.method, req.url);
      res.writeHead(404); res.end('mock: not found');
    }
  });
});
srv.listen(Number(port), '127.0.0.1');
