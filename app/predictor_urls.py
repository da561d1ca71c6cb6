"""Predictor URLs and the predictor allow-list (transformer mode), checked without I/O.

A predictor is an address every calibrate-key request makes calibd connect to, so where it may
point is the operator's choice, not an admin key's: ``CALIBD_PREDICTOR_ALLOW`` lists the hosts and
networks allowed (none by default). This module holds the two pure checks; the service applies
them when a predictor is set, and the client that connects applies them again to the addresses a
name resolves to, at connect time, then connects to a checked address (docs/transformer.md).

A predictor URL is ``http(s)://host[:port][/prefix]`` or ``grpc://host:port``: printable ASCII,
its host a literal (a DNS name, a dotted-quad IPv4 address or a bracketed IPv6 one), no
credentials, query or fragment, its path percent-encoded, and for gRPC no name resolver's scheme
(``unix:``, ``dns:``, ``ipv4:`` ...) where the host should be.

An allow-list entry is a host name, an IP address or a CIDR network, with an optional port
(``predictor.models.svc:8080``, ``10.0.0.0/8``, ``[fd00::/8]:8081``, ``127.0.0.1:8080``). An address
is allowed by a network (or address) that holds it; a name by an entry naming it, and then at
whatever it resolves to, or else by the networks, each of its addresses checked. Loopback and
link-local addresses (169.254.0.0/16 holds cloud metadata services) are allowed only by an entry
inside those ranges, never by a wider network such as 0.0.0.0/0; unspecified, multicast and
broadcast addresses never.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: How a predictor is reached: the inference protocol over REST (http, https) or gRPC.
SCHEMES = ("http", "https", "grpc")
DEFAULT_PORTS = {"http": 80, "https": 443}

#: gRPC target prefixes that name a resolver, not a host: grpc://unix:1 would be the socket "1".
GRPC_RESOLVERS = frozenset({"unix", "unix-abstract", "vsock", "dns", "ipv4", "ipv6", "xds", "google-c2p", "passthrough"})

#: Reached only through an entry inside them (loopback, link-local: cloud metadata lives there).
GUARDED = tuple(
    ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10")
)
#: Never a predictor: "this host" (0.0.0.0 reaches loopback), multicast, broadcast.
NEVER = tuple(
    ipaddress.ip_network(n) for n in ("0.0.0.0/8", "::/128", "224.0.0.0/4", "ff00::/8", "255.255.255.255/32")
)

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
#: A last label that is a number makes the host an IPv4 address to resolvers (0, 127.1, 0x7f.1).
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")
_PATH = re.compile(r"(?:/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})*)*")


class PredictorUrlError(ValueError):
    """A predictor URL or allow-list entry that is refused; the message says why."""


@dataclass(frozen=True)
class Target:
    """Where a predictor URL points: its scheme, host (a name, lowercase, or an address), port
    (the scheme's default filled in) and path."""

    scheme: str
    host: str
    port: int
    path: str
    address: IPAddress | None  # the host, when it is an address


def _address(text: str) -> IPAddress:
    value = ipaddress.ip_address(text)
    if isinstance(value, ipaddress.IPv6Address) and value.ipv4_mapped is not None:
        return value.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return value


def _check_name(host: str) -> str:
    name = host.lower()
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise PredictorUrlError(f"the host {host!r} is neither a DNS name nor an IP address")
    if _NUMBER.fullmatch(labels[-1]):
        raise PredictorUrlError(f"the host {host!r} is not a dotted-quad IPv4 address nor a DNS name")
    return name


def _split_host_port(netloc: str) -> tuple[str, str | None, bool]:
    """``host[:port]`` or ``[v6]:port``: the host, the port's text (None: none), and whether bracketed."""
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise PredictorUrlError("an IPv6 host needs its closing bracket")
        rest = netloc[end + 1 :]
        if rest and not rest.startswith(":"):
            raise PredictorUrlError("after an IPv6 host's bracket comes only :port")
        return netloc[1:end], (rest[1:] if rest else None), True
    host, colon, port = netloc.rpartition(":")
    return (host, port, False) if colon else (netloc, None, False)


def _port(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise PredictorUrlError(f"the port {text!r} is not a number from 1 to 65535")
    return int(text)


def _host(text: str, bracketed: bool) -> tuple[str, IPAddress | None]:
    if not text:
        raise PredictorUrlError("must name the predictor's host")
    if bracketed:
        try:
            if "%" in text:
                raise ValueError(text)
            address = _address(text)
        except ValueError:
            raise PredictorUrlError(f"[{text}] is not an IPv6 address (zone ids are not taken)") from None
    elif ":" in text:
        raise PredictorUrlError("an IPv6 host is written in brackets: [::1]:8080")
    else:
        try:
            address = _address(text)
        except ValueError:
            return _check_name(text), None
    if any(address in network for network in NEVER):
        raise PredictorUrlError(f"{address} is never a predictor (unspecified, multicast or broadcast)")
    return str(address), address


def parse(url: str) -> Target:
    """The predictor URL's target. Raises PredictorUrlError saying what is wrong."""
    if not isinstance(url, str) or not url.isascii() or not url.isprintable() or " " in url:
        raise PredictorUrlError("must be printable ASCII without spaces (percent-encode the rest)")
    if "?" in url or "#" in url:
        raise PredictorUrlError("must have no query or fragment")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise PredictorUrlError("is not a URL") from None
    if parts.scheme not in SCHEMES or not url.lower().startswith(f"{parts.scheme}://"):
        raise PredictorUrlError("must be an http://, https:// or grpc:// URL")
    if "@" in parts.netloc:
        raise PredictorUrlError("must have no credentials")
    host_text, port_text, bracketed = _split_host_port(parts.netloc)
    host, address = _host(host_text, bracketed)
    port = _port(port_text)
    if parts.scheme == "grpc":
        if port is None or parts.path.strip("/"):
            raise PredictorUrlError("a gRPC predictor is grpc://host:port, with no path")
        if host in GRPC_RESOLVERS:
            raise PredictorUrlError(f"{host!r} is a gRPC name resolver's scheme, not a host")
    elif not _PATH.fullmatch(parts.path) or any(s in (".", "..") for s in parts.path.split("/")):
        raise PredictorUrlError("the path must be /segments of unreserved characters or %XX escapes, without . or ..")
    return Target(parts.scheme, host, port or DEFAULT_PORTS[parts.scheme], parts.path.rstrip("/"), address)


def check_url(url: str) -> str:
    """A valid predictor URL, without its trailing slash. Raises PredictorUrlError."""
    parse(url)
    return url.rstrip("/")


@dataclass(frozen=True)
class Entry:
    """One allow-list entry: a network (an address is a network of one) or a name, and a port (None: any)."""

    network: IPNetwork | None
    name: str | None
    port: int | None

    def covers_port(self, port: int) -> bool:
        return self.port is None or self.port == port


def parse_entry(text: str) -> Entry:
    """``name[:port]``, ``address[:port]``, ``network[:port]``; IPv6 in brackets when a port follows."""
    if text.count(":") >= 2 and not text.startswith("["):
        host, port, bracketed = text, None, True  # a bare IPv6 address or network, no port
    else:
        host, port, bracketed = _split_host_port(text)
    if not host:
        raise PredictorUrlError(f"{text!r}: no host")
    port_number = _port(port)
    if "/" in host or bracketed or not _looks_like_name(host):
        try:
            network = ipaddress.ip_network(host, strict=False)
        except ValueError:
            raise PredictorUrlError(f"{text!r} is neither a host name nor an IP address or network") from None
        if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96 and network[0].ipv4_mapped:
            network = ipaddress.ip_network(f"{network[0].ipv4_mapped}/{network.prefixlen - 96}")
        if any(network.subnet_of(never) for never in NEVER if never.version == network.version):
            raise PredictorUrlError(f"{text!r}: unspecified, multicast and broadcast addresses are never predictors")
        return Entry(network, None, port_number)
    try:
        return Entry(None, _check_name(host), port_number)
    except PredictorUrlError:
        raise PredictorUrlError(f"{text!r} is neither a host name nor an IP address or network") from None


def _looks_like_name(host: str) -> bool:
    return not _NUMBER.fullmatch(host.lower().rsplit(".", 1)[-1])


class AllowList:
    """The predictors calibd may connect to: ``CALIBD_PREDICTOR_ALLOW``'s entries, and those of the
    operator's own predictor settings."""

    def __init__(self, entries: tuple[Entry, ...] = ()):
        self.entries = entries

    @classmethod
    def parse(cls, text: str) -> AllowList:
        """Entries separated by commas or spaces. Raises PredictorUrlError naming the bad one."""
        return cls(tuple(parse_entry(item) for item in re.split(r"[,\s]+", text.strip()) if item))

    def including(self, urls: list[str]) -> AllowList:
        """With the targets of these URLs allowed too (the operator named them): each name or
        address, at its port."""
        extra = []
        for url in urls:
            target = parse(url)
            network = None if target.address is None else ipaddress.ip_network(target.address)
            extra.append(Entry(network, None if network else target.host, target.port))
        return AllowList(self.entries + tuple(extra))

    def permits_address(self, address: IPAddress, port: int) -> bool:
        """Whether calibd may connect to this address and port."""
        address = _address(str(address))
        if any(address in network for network in NEVER):
            return False
        guarded = [g for g in GUARDED if g.version == address.version and address in g]
        for entry in self.entries:
            if entry.network is None or not entry.covers_port(port) or address not in entry.network:
                continue
            if all(entry.network.subnet_of(g) for g in guarded):
                return True
        return False

    def names(self, name: str, port: int) -> bool:
        """Whether an entry names this host at this port (then its addresses are the name's owner's call)."""
        return any(e.name == name and e.covers_port(port) for e in self.entries)

    def refusal(self, target: Target) -> str | None:
        """Why a predictor URL's target is not allowed when it is set (None: it is, so far as can be
        known before its name is resolved: a name no entry names may resolve into a network)."""
        if target.address is not None:
            if self.permits_address(target.address, target.port):
                return None
        elif self.names(target.host, target.port) or any(
            e.network is not None and e.covers_port(target.port) for e in self.entries
        ):
            return None
        return f"{target.host} port {target.port} is not in CALIBD_PREDICTOR_ALLOW"

    def connectable(self, host: str, port: int, addresses: list[str]) -> list[IPAddress]:
        """Of the addresses ``host`` resolved to, those calibd may connect to, in order."""
        named = self.names(host, port)
        kept = []
        for text in addresses:
            address = _address(text.split("%", 1)[0])
            if any(address in network for network in NEVER):
                continue
            if named or self.permits_address(address, port):
                kept.append(address)
        return kept
