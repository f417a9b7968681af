# Sourced by the setup scripts.
#   is_installed PACKAGE             true when the Debian package is installed
#   apt_install_missing TAG PKG...   installs the packages that are not (through sudo when not root)
is_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

apt_install_missing() {
  local tag="$1" p missing=()
  shift
  for p in "$@"; do
    is_installed "$p" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "$tag: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}
