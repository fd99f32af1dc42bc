#!/bin/sh
# examples/check-bad-options.sh FASHION_MNIST TRAIN_SYNTHETIC — both examples read their
# numbers whole: a value that is not a number or is out of range ends the program with
# status 2, a message naming the option and the usage line, before it loads data or trains
# (the data folder given here does not exist, so a run that went on would fail otherwise).
set -u
fashion=$1
synthetic=$2
failed=0

# expect NEEDLE PROGRAM ARGS...: status 2, NEEDLE and "usage:" on stderr
expect() {
    needle=$1
    shift
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    if [ "$rc" -ne 2 ]; then
        echo "FAIL: $* exited with $rc, not 2: $err"
        failed=1
    elif ! printf '%s\n' "$err" | grep -qF -- "$needle"; then
        echo "FAIL: $*: the message lacks '$needle': $err"
        failed=1
    elif ! printf '%s\n' "$err" | grep -q "^usage:"; then
        echo "FAIL: $*: no usage line: $err"
        failed=1
    else
        echo "ok: $*"
    fi
}

KILN_FASHION_MNIST=/nonexistent/fashion-mnist
export KILN_FASHION_MNIST
expect '--lr "abc" is not a finite number above 0' "$fashion" mlp 1 --lr abc
expect '--lr "0" is not a finite number above 0' "$fashion" mlp 1 --lr 0
expect '--lr "inf" is not a finite number above 0' "$fashion" mlp 1 --lr inf
expect '--subset "-5" is not a whole number from 1 to' "$fashion" mlp 1 --subset -5
expect '--test-subset "10x" is not a whole number from 1 to' "$fashion" mlp 1 --test-subset 10x
expect '--batch "0" is not a whole number from 1 to' "$fashion" mlp 1 --batch 0
expect '--workers "999" is not a whole number from 0 to 256' "$fashion" mlp 1 --workers 999
expect 'epochs "abc" is not a whole number from 1 to' "$fashion" mlp abc
expect 'epochs "0" is not a whole number from 1 to' "$fashion" cnn 0
expect 'model "rnn" must be mlp or cnn' "$fashion" rnn 1
expect 'epochs "abc" is not a whole number from 1 to 100000' "$synthetic" cpu abc
expect 'epochs "-3" is not a whole number from 1 to 100000' "$synthetic" cpu -3
expect 'unexpected argument "7"' "$synthetic" cpu 3 7
# --help (or -h) anywhere: the usage on stdout, status 0, nothing run
for prog in "$fashion" "$synthetic"; do
    for flag in --help -h; do
        out=$("$prog" $flag 2>/dev/null)
        rc=$?
        if [ "$rc" -ne 0 ] || ! printf '%s\n' "$out" | grep -q "^usage:"; then
            echo "FAIL: $prog $flag exited with $rc, stdout: $out"
            failed=1
        else
            echo "ok: $prog $flag"
        fi
    done
done
exit $failed
