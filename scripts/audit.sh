#!/usr/bin/env bash
# Checks Cargo.lock against the RustSec advisory database with cargo-audit, offline: the
# database's GitHub home is not reachable from CI, so a snapshot travels with the project
# (third_party/advisory-db.tar.xz; its commit and date are in third_party/README.md; refresh it
# from github.com/rustsec/advisory-db when you can). Fails on any vulnerability not
# explained in .cargo/audit.toml; unmaintained and unsound crates are reported as warnings.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=0.22.2
if ! cargo audit --version 2>/dev/null | grep -q " $version\$"; then
    cargo install cargo-audit --version "$version" --locked
fi
db=target/advisory-db
rm -rf "$db"
mkdir -p target
tar -C target -xJf third_party/advisory-db.tar.xz
cargo audit --no-fetch --db "$db" --file Cargo.lock
