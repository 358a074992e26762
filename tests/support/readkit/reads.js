// Node's ways of reading a whole file: `node reads.js FILE...` prints one JSON object
// {method: {file: base64 or "!error"}}. readFileSync and readFile size their buffer by
// st_size and stop there (or at EOF, whichever comes first).
"use strict";
const fs = require("fs");

async function main(files) {
  const out = { "node-readFileSync": {}, "node-readFile": {}, "node-promises.readFile": {} };
  for (const f of files) {
    try {
      out["node-readFileSync"][f] = fs.readFileSync(f).toString("base64");
    } catch (e) {
      out["node-readFileSync"][f] = "!" + e.message;
    }
    out["node-readFile"][f] = await new Promise((resolve) => {
      fs.readFile(f, (err, data) => resolve(err ? "!" + err.message : data.toString("base64")));
    });
    try {
      out["node-promises.readFile"][f] = (await fs.promises.readFile(f)).toString("base64");
    } catch (e) {
      out["node-promises.readFile"][f] = "!" + e.message;
    }
  }
  process.stdout.write(JSON.stringify(out));
}

main(process.argv.slice(2));
