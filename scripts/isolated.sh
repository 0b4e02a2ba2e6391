#!/usr/bin/env bash
# isolated.sh PROGRAM [ARGS...]: runs PROGRAM in a new session with only
# stdin, stdout and stderr open, under this script's PID. A descriptor
# inherited from whatever started us (often a pipe) would otherwise become
# part of the program's checkpointed state.
for fd in /proc/$$/fd/*; do
  fd=${fd##*/}
  if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
done
exec setsid "$@"
