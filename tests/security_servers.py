"""Servers with security on, for the security tests: a mongod replica set with `--auth` and a
keyfile (its first user made through the localhost exception), users holding exactly the relay's
role, and a throwaway certificate authority (the `cryptography` package) for the TLS tests.

Every server lives in a fresh temporary folder and is stopped by process id.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import ipaddress
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymongo

from relay.dev.stack import MongoReplicaSet
from relay.mongo.privileges import Privilege, role_document
from tests.support.topics import release_kafka_clients

ADMIN_USER = "admin"


@dataclass
class AuthMongo:
    """A replica set with authentication on, and its administrator's password."""

    rs: MongoReplicaSet
    admin_password: str
    certs: Certificates | None = None  # with TLS required: the CA clients must trust

    def uri(self, user: str, password: str) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.rs.ports)
        options = f"&{self.rs.uri_options}" if self.rs.uri_options else ""
        return f"mongodb://{user}:{password}@{hosts}/?replicaSet={self.rs.name}&authSource=admin{options}"

    @property
    def admin_uri(self) -> str:
        return self.uri(ADMIN_USER, self.admin_password)

    def admin(self) -> pymongo.MongoClient[Any]:
        return pymongo.MongoClient(self.admin_uri, tz_aware=True)

    def user_with(self, user: str, password: str, privileges: Sequence[Privilege]) -> str:
        """Create (or replace) a role holding exactly `privileges` and a user holding only it;
        returns the user's URI."""
        role = f"{user}Role"
        with self.admin() as client:
            admin = client.admin
            if admin.command({"rolesInfo": role})["roles"]:
                admin.command({"dropRole": role})
            admin.command(role_document(role, privileges))
            if admin.command({"usersInfo": user})["users"]:
                admin.command({"dropUser": user})
            admin.command({"createUser": user, "pwd": password, "roles": [{"role": role, "db": "admin"}]})
        return self.uri(user, password)


@contextlib.contextmanager
def auth_mongo(tls: bool = False) -> Iterator[AuthMongo]:
    """A one-member replica set started with `--auth --keyFile` (and, with `tls`, `--tlsMode
    requireTLS` with a certificate from a throwaway CA), initiated and given an administrator
    through the localhost exception."""
    base = Path(tempfile.mkdtemp(prefix="relay-auth-"))
    key = base / "keyfile"
    key.write_text(base64.b64encode(secrets.token_bytes(48)).decode())  # base64 characters only
    key.chmod(0o400)
    args, uri_options, certs = ["--auth", "--keyFile", str(key)], "", None
    if tls:
        certs = make_certificates(base / "tls")
        args += ["--tlsMode", "requireTLS", "--tlsCertificateKeyFile", str(certs.combined), "--tlsCAFile",
                 str(certs.ca), "--tlsAllowConnectionsWithoutCertificates"]
        uri_options = f"tls=true&tlsCAFile={certs.ca}"
    rs = MongoReplicaSet(base / "rs", extra_args=args, uri_options=uri_options)
    password = secrets.token_urlsafe(16)
    try:
        rs.start()  # initiates through the localhost exception (no user exists yet)
        with pymongo.MongoClient(rs.uri, serverSelectionTimeoutMS=10000) as client:
            client.admin.command({"createUser": ADMIN_USER, "pwd": password, "roles": ["root"]})
        yield AuthMongo(rs, password, certs)
    finally:
        rs.stop()
        shutil.rmtree(base, ignore_errors=True)


# ---- a throwaway certificate authority --------------------------------------------------------


@dataclass
class Certificates:
    """PEM files: the CA's certificate, and a server's certificate and key signed by it."""

    ca: Path
    cert: Path
    key: Path
    combined: Path  # certificate then key, as mongod's --tlsCertificateKeyFile takes them


def _authority(name: str, now: dt.datetime) -> tuple[Any, Any]:
    """A self-signed CA: its private key and certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"outbox-relay test {name}")])
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_certificates(folder: Path, host: str = "127.0.0.1", name: str = "ca") -> Certificates:
    """A new CA and a server certificate for `host` (an IP address or a DNS name) signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, ca = _authority(name, now)
    ca_name = ca.subject
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        san = x509.DNSName(host)
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    out = Certificates(folder / f"{name}.pem", folder / f"{name}-server.pem", folder / f"{name}-server.key",
                       folder / f"{name}-server-combined.pem")
    out.ca.write_bytes(ca.public_bytes(pem))
    out.cert.write_bytes(cert.public_bytes(pem))
    out.key.write_bytes(key_pem)
    out.combined.write_bytes(cert.public_bytes(pem) + key_pem)
    return out


# ---- a Kafka broker with SASL/SCRAM and ACLs ---------------------------------------------------

SCRAM = "SCRAM-SHA-256"
_SASL_PROPERTIES = """
listeners=SASL_SSL://127.0.0.1:{{port}},CONTROLLER://127.0.0.1:{{controller_port}}
advertised.listeners=SASL_SSL://127.0.0.1:{{port}}
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=SASL_SSL
ssl.keystore.type=PEM
ssl.keystore.location={keystore}
ssl.truststore.type=PEM
ssl.truststore.location={ca}
ssl.client.auth=none
sasl.enabled.mechanisms={mechanism}
sasl.mechanism.inter.broker.protocol={mechanism}
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=\
org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:{user};User:ANONYMOUS
allow.everyone.if.no.acl.found=false
"""


@dataclass
class SaslKafka:
    """A KRaft broker whose client listener takes SASL/SCRAM over TLS only (SASL_SSL, a PEM
    keystore from a throwaway CA) and authorizes with ACLs (StandardAuthorizer); its administrator
    is a super user (as is the controller listener's anonymous principal, which only the broker
    itself uses)."""

    broker: Any  # relay.dev.stack.KafkaBroker
    admin_password: str
    certs: Certificates

    def client(self, user: str, password: str) -> dict[str, str]:
        return {"security.protocol": "SASL_SSL", "ssl.ca.location": str(self.certs.ca), "sasl.mechanisms": SCRAM,
                "sasl.username": user, "sasl.password": password}

    @property
    def admin_client(self) -> dict[str, str]:
        return self.client(ADMIN_USER, self.admin_password)

    def admin(self) -> Any:
        """An administrator's AdminClient: use it in a `with` block, which closes it."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.broker.bootstrap_servers, **self.admin_client})

    def add_user(self, user: str, password: str) -> dict[str, str]:
        """A SCRAM user with no ACL yet; returns its client properties."""
        from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                              password.encode())
        with self.admin() as admin:  # open until the futures resolve
            for future in admin.alter_user_scram_credentials([upsert]).values():
                future.result(timeout=30)
        return self.client(user, password)

    def grant(self, user: str, acls: Sequence[Any]) -> None:
        """ALLOW each relay.kafka.acls.Acl to `user`."""
        from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

        bindings = [AclBinding(ResourceType[a.resource], a.name, ResourcePatternType[a.pattern], f"User:{user}", "*",
                               AclOperation[a.operation], AclPermissionType.ALLOW) for a in acls]
        with self.admin() as admin:
            for future in admin.create_acls(bindings).values():
                future.result(timeout=30)

    def create_topics(self, *topics: str, partitions: int = 3) -> None:
        from confluent_kafka.admin import NewTopic

        with self.admin() as admin:
            for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
                future.result(timeout=30)


@contextlib.contextmanager
def sasl_kafka() -> Iterator[SaslKafka]:
    """A SASL/SCRAM broker with ACLs, its administrator's SCRAM credential made at `storage format`."""
    from relay.dev.stack import QUICK_START_JVM, KafkaBroker

    base = Path(tempfile.mkdtemp(prefix="relay-sasl-"))
    password = secrets.token_urlsafe(16)
    certs = make_certificates(base / "tls")
    properties = _SASL_PROPERTIES.format(mechanism=SCRAM, user=ADMIN_USER, password=password, ca=certs.ca,
                                         keystore=certs.combined)
    broker = KafkaBroker(base / "kafka", heap="512m", extra_properties=properties, jvm_options=QUICK_START_JVM,
                         format_args=["--add-scram", f"{SCRAM}=[name={ADMIN_USER},password={password}]"])
    server = SaslKafka(broker, password, certs)
    broker.client_config = server.admin_client
    try:
        broker.start()
        yield server
    finally:
        release_kafka_clients()
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)
