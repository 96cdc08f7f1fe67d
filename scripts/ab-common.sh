# Sourced by ab-decode.sh and ab-kernels.sh: the two revisions from the command line, the
# output folder, the shared cargo target directory, and a command run in a temporary git
# worktree of one revision (one build at a time, into that target directory).
#
#   ab_args USAGE "$@"   sets old, new (default HEAD) and rest (what follows --)
#   ab_in_tree REV CMD…  runs CMD in a worktree of REV with CARGO_TARGET_DIR set; its stdout
#                        passes through

ab_args() {
    local usage=$1
    shift
    old=${1:?usage: $usage}
    shift
    new=HEAD
    if [ $# -gt 0 ] && [ "$1" != "--" ]; then
        new=$1
        shift
    fi
    [ $# -eq 0 ] || { [ "$1" = "--" ] && shift; }
    rest=("$@")
    export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
    target=$(cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
}

ab_in_tree() {
    local rev=$1 tree
    shift
    tree=$(mktemp -d)
    git worktree add --detach -q "$tree" "$rev"
    (cd "$tree" && CARGO_TARGET_DIR="$target" "$@")
    git worktree remove --force "$tree"
}
