#!/bin/sh
# The images' entrypoint. A first argument that is an option or not a program on PATH goes to flashdraft
# (`docker run IMAGE --version`, `docker run IMAGE plan --preset tiny`); a program on PATH runs as given, so a local
# container runner that passes its own command (kfp.local's DockerRunner: `sh -c ...`) works. Kubernetes pods set
# `command:`, which replaces this entrypoint altogether.
set -e
on_path() {
  case "$1" in */*) [ -f "$1" ] && [ -x "$1" ]; return ;; esac
  old_ifs=$IFS
  IFS=:
  for dir in $PATH; do
    if [ -f "$dir/$1" ] && [ -x "$dir/$1" ]; then IFS=$old_ifs; return 0; fi
  done
  IFS=$old_ifs
  return 1
}
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ] || ! on_path "$1"; then
  set -- flashdraft "$@"
fi
exec "$@"
