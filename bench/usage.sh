# Sourced by the bench scripts: `-h` or `--help` prints the script's header
# comment (its usage) and exits, instead of starting a benchmark.
case "${1:-}" in
-h | --help)
    sed -n '2,/^[^#]/{/^#/{s/^# \{0,1\}//;p}}' "$0"
    exit 0
    ;;
esac
