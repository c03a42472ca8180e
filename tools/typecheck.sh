#!/usr/bin/env bash
# mypy over the whole package as it is imported (apportion.scheduler, apportion.worker,
# apportion.operator live in top-level folders, mapped by pyproject's package-dir, which mypy
# does not read). A tree of links under build/typecheck lays the sources out by import name;
# mypy's report names the real files again.
set -euo pipefail
cd "$(dirname "$0")/.."
MYPY=${MYPY:-.venv/bin/mypy}
STAGE=build/typecheck
rm -rf "$STAGE"
mkdir -p "$STAGE/apportion"
for entry in apportion/*; do
    [ "$(basename "$entry")" = __pycache__ ] || ln -s "$PWD/$entry" "$STAGE/apportion/"
done
ln -s "$PWD/scheduler" "$STAGE/apportion/scheduler"
ln -s "$PWD/worker" "$STAGE/apportion/worker"
ln -s "$PWD/k8s_operator" "$STAGE/apportion/operator"
cd "$STAGE"
status=0
"$OLDPWD/$MYPY" --config-file "$OLDPWD/pyproject.toml" --cache-dir "$OLDPWD/.mypy_cache" -p apportion > report.txt 2>&1 || status=$?
sed -e 's#^apportion/scheduler/#scheduler/#' -e 's#^apportion/worker/#worker/#' \
    -e 's#^apportion/operator/#k8s_operator/#' report.txt
exit $status
