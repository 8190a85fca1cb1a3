#!/usr/bin/env bash
# The layers of docs/design.md ("The house"), checked on the #include lines: each folder of src/
# may include the folders listed for it and nothing else; a private header (*_impl.h, and
# everything under kernels/cpu/) is included only from its own folder. Fails on the first run
# that breaks the table, naming the file, the line and the rule. tests/run.sh runs it.
#
#   scripts/check-includes.sh [ROOT]     ROOT holds the src/ to check (default: this repository)
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# folder: the folders of src/ its files may include (include/sampan/ is open to every folder).
declare -A ALLOW=(
    [core]="core"
    [kernels]="core kernels"
    [cuda]="core cuda kernels/kernels.h"
    [crypto]="core crypto"
    [device]="core device"
    [gguf]="core gguf kernels/kernels.h crypto"
    [text]="core text gguf"
    [chat]="core chat text gguf"
    [constrain]="core constrain chat text gguf"
    [engine]="core engine kernels/kernels.h cuda/cuda_api.h cuda/cuda_common.h cuda/loader.h gguf text chat constrain crypto"
    [sched]="core sched engine kernels/kernels.h gguf text chat constrain crypto"
    [http]="core http crypto"
    [serving]="core serving sched engine kernels/kernels.h cuda/loader.h gguf text chat constrain crypto device http"
    [api]="core api serving sched engine kernels/kernels.h cuda/loader.h gguf text chat constrain crypto device http"
    [server]="core server api serving sched engine kernels/kernels.h cuda/loader.h gguf text chat constrain crypto device http"
    [tools]="core tools serving sched engine kernels/kernels.h cuda/loader.h gguf text chat constrain crypto device"
)

bad=0
while IFS= read -r -d '' f; do
    rel=${f#src/}
    dir=${rel%%/*}
    [ "$dir" = "$rel" ] && continue            # src/main.c: the entry point calls every floor
    allow=${ALLOW[$dir]:-}
    if [ -z "$allow" ]; then
        echo "$f: folder src/$dir/ is not in the layer table of scripts/check-includes.sh"; bad=1; continue
    fi
    while IFS=: read -r line inc; do
        inc=${inc#*\"}; inc=${inc%%\"*}
        case $inc in sampan/*|*.pb-c.h|status_page_html.h) continue ;; esac
        top=${inc%%/*}
        [ "$top" = "$inc" ] && continue       # a same-folder include written without its folder
        ok=0
        for a in $allow; do
            if [ "$a" = "$top" ] || [ "$a" = "$inc" ]; then ok=1; break; fi
        done
        if [ $ok = 0 ]; then
            echo "$f:$line: includes \"$inc\": src/$dir/ may include only: $allow"; bad=1
        fi
        # private headers: only their own folder
        if [ "$top" != "$dir" ] && { [[ $inc == *_impl.h ]] || [[ $inc == kernels/cpu/* ]]; }; then
            echo "$f:$line: includes \"$inc\", a private header of src/$top/"; bad=1
        fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$f" || true)
done < <(find src -name '*.c' -o -name '*.h' -o -name '*.cu' | sort | tr '\n' '\0')

[ $bad -eq 0 ] && echo "check-includes: ok"
exit $bad
