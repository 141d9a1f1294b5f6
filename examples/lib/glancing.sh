# shellcheck shell=bash
# Sourced by the recipes that train with glancing (GLAT): reads GLAT=START-END (the share of the first
# pass' wrong positions revealed, linear from START to END over MAX_UPDATE; 0-0: off), default $1, and
# sets GLAT_ARGS to the criterion's --glat-ratio-start/--glat-ratio-end.
GLAT="${GLAT:-$1}"
GLAT_NUM='(0(\.[0-9]+)?|1(\.0+)?|\.[0-9]+)'
[[ "$GLAT" =~ ^${GLAT_NUM}-${GLAT_NUM}$ ]] ||
  { echo "error: GLAT must be START-END with both in [0, 1], e.g. 0.5-0.3, got '$GLAT'" >&2; exit 1; }
GLAT_ARGS=(--glat-ratio-start "${GLAT%-*}" --glat-ratio-end "${GLAT#*-}")
