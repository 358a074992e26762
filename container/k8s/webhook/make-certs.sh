#!/usr/bin/env bash
# The webhook's certificate without cert-manager, in one shot: a CA of its own (kept in
# DIR, never in the cluster), a serving certificate for the Service's names signed by it,
# and, with --apply, the Secret guestfs-webhook-tls and the CA as the caBundle of the
# MutatingWebhookConfiguration guestfs-webhook. Run it again to renew (the webhook reloads
# the Secret's files once kubelet has updated them, about a minute later).
#
#   make-certs.sh [--dir DIR] [--namespace NS] [--service NAME] [--days N] [--san SAN]...
#                 [--apply]
#
# DIR defaults to ./guestfs-webhook-certs; it gets ca.crt, ca.key, tls.crt, tls.key. --san
# adds a subjectAltName (DNS:name or IP:address) to the Service's own names. Needs openssl
# (and kubectl for --apply).
set -euo pipefail

dir=./guestfs-webhook-certs namespace=kube-system service=guestfs-webhook days=365 apply=0
sans=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --namespace) namespace=$2; shift 2 ;;
    --service) service=$2; shift 2 ;;
    --days) days=$2; shift 2 ;;
    --san) sans+=("$2"); shift 2 ;;
    --apply) apply=1; shift ;;
    *) echo "make-certs.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

mkdir -p "$dir"
umask 077
names="DNS:$service,DNS:$service.$namespace,DNS:$service.$namespace.svc"
names="$names,DNS:$service.$namespace.svc.cluster.local"
for san in "${sans[@]}"; do names="$names,$san"; done

if [ ! -s "$dir/ca.key" ]; then
  # The CA is kept across runs: a renewal then needs no new caBundle.
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" -days 3650 \
    -subj "/CN=guestfs-webhook-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
  -keyout "$dir/tls.key.new" -out "$dir/tls.csr" \
  -subj "/CN=$service.$namespace.svc" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n' \
  "$names" > "$dir/tls.ext"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
  -CAcreateserial -out "$dir/tls.crt.new" -days "$days" -extfile "$dir/tls.ext" 2>/dev/null
# Certificate and key replaced together, the key first: a reader that sees the new
# certificate finds its key.
mv "$dir/tls.key.new" "$dir/tls.key"
mv "$dir/tls.crt.new" "$dir/tls.crt"
rm -f "$dir/tls.csr" "$dir/tls.ext"
echo "make-certs.sh: $dir/tls.crt for $names, signed by $dir/ca.crt"

if [ "$apply" = 1 ]; then
  kubectl -n "$namespace" create secret tls "$service-tls" --cert "$dir/tls.crt" \
    --key "$dir/tls.key" --dry-run=client -o yaml | kubectl apply -f -
  bundle=$(base64 -w0 < "$dir/ca.crt")
  kubectl patch mutatingwebhookconfiguration guestfs-webhook --type json -p \
    "[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$bundle\"},
      {\"op\":\"add\",\"path\":\"/webhooks/1/clientConfig/caBundle\",\"value\":\"$bundle\"}]"
fi
