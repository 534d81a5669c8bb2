#!/usr/bin/env bash
# Sets everything up and runs the main job: `vrampool demo` (on the simulated device without a GPU).
source "$(dirname "$0")/env.sh"
cd "$root"
install_wheel
vrampool demo "$@"
