# example-lib.sh: what the out-of-tree example tests share (tests/example-plugin.sh and
# tests/example-model.sh), sourced by each after it sets `name` (its messages' prefix):
#   - say, fail (exit 1) and show; the checks that make check set GHC_TOP_BUILDDIR and
#     GHC_TOP_SRCDIR; exit 77 (skip) without pkg-config; MAKE and pkg_config;
#   - tmp, a temporary folder removed at exit (GHC_KEEP_TMP=1 keeps it), and stage, the
#     staging root under it;
#   - stage_install: this build's core installed into the staging root, and pkg-config
#     pointed at it (PKG_CONFIG_PATH, staged_pc);
#   - build_example: an example built out of tree against the staged tree, checked for its one
#     exported symbol;
#   - stage_run: the installed CLI's environment; run_cli runs it.
# Not executable on its own: sourced (`. "$GHC_TOP_SRCDIR/tests/example-lib.sh"`).
# shellcheck shell=sh
# shellcheck disable=SC2154  # name: set by the sourcing script

say() { printf '%s: %s\n' "$name" "$*"; }
fail() { printf '%s: FAIL: %s\n' "$name" "$*" >&2; exit 1; }
# Print a log file (after a failure), indented.
show() { sed 's/^/    /' "$1" >&2; }

: "${GHC_TOP_BUILDDIR:?run through make check (GHC_TOP_BUILDDIR unset)}"
: "${GHC_TOP_SRCDIR:?run through make check (GHC_TOP_SRCDIR unset)}"
MAKE=${MAKE:-make}
pkg_config=${PKG_CONFIG:-pkg-config}
if ! command -v "$pkg_config" >/dev/null 2>&1; then
    say "SKIP: $pkg_config not found; the out-of-tree build needs it"
    exit 77
fi

# The plugins built here must not be writable by group or others (the loader refuses those),
# whatever the caller's umask.
umask 022
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ghc-$name.XXXXXX") || fail "mktemp -d failed"
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    if [ -n "${GHC_KEEP_TMP:-}" ]; then
        say "kept $tmp"
    else
        chmod -R u+w "$tmp" 2>/dev/null
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM
stage=$tmp/root

# Install this build into the staging root: sets prefix, exec_prefix, libdir, includedir (where
# the build installs, from its gh200core.pc), pc (the staged gh200core.pc), cli (the staged
# CLI) and staged_pc (pkg-config with the staged prefix), and exports PKG_CONFIG_PATH.
stage_install() {
    pc_build=$GHC_TOP_BUILDDIR/gh200core.pc
    [ -r "$pc_build" ] || fail "$pc_build missing: configure and build first"
    prefix=; exec_prefix=
    prefix=$(pcvar prefix)
    exec_prefix=$(pcvar exec_prefix)
    libdir=$(pcvar libdir)
    includedir=$(pcvar includedir)
    case $prefix in /*) ;; *) fail "$pc_build: prefix '$prefix' is not an absolute path" ;; esac
    say "this build installs into prefix=$prefix (libdir=$libdir)"

    # The sub-makes start afresh: the jobserver and command-line variables of the `make check`
    # that runs this script are not theirs (and a third party's build never sees them).
    unset MAKEFLAGS MFLAGS
    # What a plugin author needs (libgh200core, the headers, the .pc files, the CLI), not the
    # other libraries nor the shipped plugins: libtool relinks a library that links another
    # uninstalled one when it installs it, and a relink moves its .libs/*.so aside in the build
    # tree for a moment, under the feet of the tests that load them in parallel (make -j check).
    only="lib_LTLIBRARIES=libgh200core.la plugins_LTLIBRARIES="
    say "$MAKE -C $GHC_TOP_BUILDDIR install DESTDIR=$stage $only"
    # shellcheck disable=SC2086  # $only is two words
    if ! $MAKE -C "$GHC_TOP_BUILDDIR" install DESTDIR="$stage" $only >"$tmp/install.log" 2>&1; then
        show "$tmp/install.log"
        fail "make install DESTDIR=$stage failed (log above)"
    fi
    pc=$(find "$stage" -name gh200core.pc -type f | head -n 1)
    [ -n "$pc" ] || fail "no gh200core.pc installed under $stage"
    [ -r "$(dirname "$pc")/gh200core-ops.pc" ] || fail "no gh200core-ops.pc installed beside $pc"
    cli=$stage$exec_prefix/bin/gh200core
    [ -x "$cli" ] || fail "the installed CLI $cli is missing"
    [ -d "$stage$libdir" ] || fail "the installed libdir $stage$libdir is missing"
    say "installed: $pc, $cli"
    # libgh200core_ops is not installed above (it links libgh200core.la: libtool would relink
    # it): the built one, with its links, goes into the staged libdir, where an installed one
    # would be.
    cp -P "$GHC_TOP_BUILDDIR"/.libs/libgh200core_ops.so* "$stage$libdir/" ||
        fail "cannot copy $GHC_TOP_BUILDDIR/.libs/libgh200core_ops.so* into $stage$libdir"

    PKG_CONFIG_PATH=$(dirname "$pc")
    export PKG_CONFIG_PATH
    staged_pc="$pkg_config --define-variable=prefix=$stage$prefix"
    # A libdir or includedir configured outside the prefix does not move with it: move it too.
    for var in libdir includedir; do
        case $var in libdir) want=$stage$libdir ;; *) want=$stage$includedir ;; esac
        got=$($staged_pc --variable=$var gh200core) || fail "$staged_pc --variable=$var gh200core failed"
        [ "$got" = "$want" ] || staged_pc="$staged_pc --define-variable=$var=$want"
    done
    say "PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
    say "PKG_CONFIG='$staged_pc'"
}

# A variable of the build's .pc file with ${prefix} and ${exec_prefix} expanded (autoconf's
# defaults start with them; anything else is taken as written).
# shellcheck disable=SC2016
pcvar() {
    v=$(grep "^$1=" "$pc_build" | head -n 1)
    v=${v#*=}
    case $v in
    '${prefix}'*)      v=$prefix${v#'${prefix}'} ;;
    '${exec_prefix}'*) v=$exec_prefix${v#'${exec_prefix}'} ;;
    esac
    printf '%s\n' "$v"
}

# The installed CLI's environment, once the examples are built: it also needs
# libgh200core_train (not installed here, see above), from the build tree after the staged
# libgh200core and libgh200core_ops; plugins only from the paths a command names.
stage_run() {
    LD_LIBRARY_PATH=$stage$libdir:$GHC_TOP_BUILDDIR/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
    unset GHC_PLUGIN_PATH
}

# Run the CLI with arguments "$@"; $rc is its status, $tmp/out its stdout and stderr.
run_cli() {
    say "gh200core $*"
    "$cli" "$@" >"$tmp/out" 2>&1
    # shellcheck disable=SC2034  # read by the sourcing script
    rc=$?
    sed 's/^/    /' "$tmp/out"
}

# Copy doc/examples/$1 to $tmp/$1 and build it there with its own Makefile against the staged
# tree (its log in $tmp/build.log); then its $2.so must export only the descriptor
# ghc_plugin_$2. Sets src (the copy) and so (the plugin built).
build_example() {
    src=$tmp/$1
    mkdir "$src" || fail "mkdir $src failed"
    cp -R "$GHC_TOP_SRCDIR/doc/examples/$1/." "$src/" || fail "cannot copy doc/examples/$1"
    chmod -R u+w "$src"   # distcheck's source tree is read-only, and so are copies of it
    rm -rf "$src/output" "$src/ghc_$2.so"
    say "$MAKE -C $src PKG_CONFIG='$staged_pc'"
    if ! $MAKE -C "$src" PKG_CONFIG="$staged_pc" >"$tmp/build.log" 2>&1; then
        show "$tmp/build.log"
        fail "building doc/examples/$1 out of tree failed (log above)"
    fi
    cat "$tmp/build.log"
    so=$src/ghc_$2.so
    [ -f "$so" ] || fail "make did not build $so"
    # One exported symbol (doc/plugin-guide.md section 1); the linker's own markers do not count.
    if command -v nm >/dev/null 2>&1; then
        syms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[A-Z]$/ && $3 !~ /^(_init|_fini|_edata|_end|__bss_start)$/ { print $3 }')
        [ "$syms" = "ghc_plugin_$2" ] ||
            fail "ghc_$2.so exports: $(printf '%s' "$syms" | tr '\n' ' '); expected only ghc_plugin_$2"
        say "ghc_$2.so exports only ghc_plugin_$2"
    fi
}
