#!/usr/bin/env bash
# Refreshes the crawler patterns the gateway vendors from the npm package
# isbot (https://isbot.js.org, Unlicense), which a community keeps up to date:
#
#   scripts/refresh-isbot.sh          # the latest release
#   scripts/refresh-isbot.sh 5.2.3    # one release
#
# Writes, from the package as npm serves it (needs npm and node):
# - src/api/crawlers/isbot-patterns.json: the package's name, version and
#   licence, and its pattern list (`list`, one regular expression per entry);
# - src/api/crawlers/isbot-LICENSE: the package's licence text;
# - tests/fixtures/crawlers/isbot-verdicts.json: isbot's own verdict on each
#   user agent of tests/fixtures/crawlers/user-agents.txt, which
#   tests/crawlers.rs holds the gateway's matcher to.
#
# Then run `cargo test crawlers`: every pattern must compile (a new syntax
# the matcher does not handle fails there, naming the pattern) and every
# verdict must agree. Commit the three files with the version in the message.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${1:-latest}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

(cd "$WORK" && npm pack --silent "isbot@$VERSION" >/dev/null && tar xzf isbot-*.tgz)

node - "$WORK/package" <<'JS'
const fs = require("fs");
const dir = process.argv[2];
const pkg = require(`${dir}/package.json`);
const isbot = require(dir);
const out = {
  package: pkg.name,
  version: pkg.version,
  license: pkg.license,
  source: "npm package isbot; refreshed by scripts/refresh-isbot.sh",
  patterns: isbot.list,
};
fs.writeFileSync("src/api/crawlers/isbot-patterns.json", JSON.stringify(out, null, 2) + "\n");
fs.copyFileSync(`${dir}/LICENSE`, "src/api/crawlers/isbot-LICENSE");
const agents = fs
  .readFileSync("tests/fixtures/crawlers/user-agents.txt", "utf8")
  .split("\n")
  .filter((l) => l !== "" && !l.startsWith("#"));
const verdicts = {
  isbot: pkg.version,
  verdicts: agents.map((ua) => ({ ua, crawler: isbot.isbot(ua) })),
};
fs.writeFileSync(
  "tests/fixtures/crawlers/isbot-verdicts.json",
  JSON.stringify(verdicts, null, 2) + "\n",
);
console.log(`isbot ${pkg.version}: ${isbot.list.length} patterns, ${agents.length} verdicts`);
JS
