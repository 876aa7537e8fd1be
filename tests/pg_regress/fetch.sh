#!/usr/bin/env bash
# Fetches PostgreSQL 15.18's regression scripts (src/test/regress/sql) from Debian's source
# package postgresql-15, checks the tarball's sha256, and extracts them under DIR (default
# /var/tmp/sluice-pg-regress). Prints the directory of the scripts. The apt state it needs is
# kept under DIR too: the machine's apt configuration is left as it is.
set -euo pipefail
dir="${1:-/var/tmp/sluice-pg-regress}"
version=15.18
sha256=11df0df97fe3ea4ba9a791faaf39cee1d2fe571e78885b5b55d8517d27c323b4
scripts="$dir/postgresql-$version/src/test/regress/sql"
if [ -f "$scripts/boolean.sql" ]; then
  echo "$scripts"
  exit 0
fi
mkdir -p "$dir/lists/partial"
cd "$dir"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cat > src.list <<LIST
deb-src [signed-by=$keyring] http://deb.debian.org/debian bookworm main
deb-src [signed-by=$keyring] http://deb.debian.org/debian-security bookworm-security main
LIST
apt=(-q -o Dir::Etc::SourceList="$dir/src.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$dir/lists")
apt-get "${apt[@]}" update >&2
apt-get "${apt[@]}" source --download-only "postgresql-15=$version-0+deb12u1" >&2
echo "$sha256  postgresql-15_$version.orig.tar.bz2" | sha256sum -c - >&2
tar -xjf "postgresql-15_$version.orig.tar.bz2" --wildcards "postgresql-$version/src/test/regress/sql/*"
echo "$scripts"
