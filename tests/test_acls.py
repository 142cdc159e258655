"""Kafka's ACLs on ``kl serve --acls``: the authorizer's rules (as Kafka's
StandardAuthorizer), the store in the root and ``kl acls``, CreateAcls/DescribeAcls/
DeleteAcls with kafka-acls, enforcement on every request type (the walk: a principal
allowed one topic and one group neither reads, changes nor learns the name of another
through any of them), and real clients."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import time

import pytest
from click.testing import CliRunner
from kafka.protocol.admin.acl import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)
from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
)
from kafka.protocol.admin.groups import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
)
from kafka.protocol.admin.topics import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    ElectLeadersRequest,
)
from kafka.protocol.admin.transactions import (
    DescribeProducersRequest,
    DescribeTransactionsRequest,
)
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.group import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import (
    AddPartitionsToTxnRequest,
)
from kafka_oracle import Unavailable, install, tool
from kafkafuzz import KL, batch, plain
from kafkaserver import InThread, Raw
from kafkawalk import acl_filter, creation, walk

import kl
from kl.net.acls import RECHECK_SECONDS, Acl, AclError, AclFilter, Acls, Authorizer
from kl.net.credentials import Credentials
from kl.net.kafka import frontend
from kl.net.kafka.broker import topic_uuid
from kl.net.kafka.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    INVALID_REQUEST,
    NONE,
    SECURITY_DISABLED,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)
from kl_cli.main import cli

PASSWORD = "pw of alice"
ADMIN_PASSWORD = "pw of admin"
TAF, GAF, CAF, XAF = (
    TOPIC_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    CLUSTER_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)


def acl(kind="TOPIC", name="orders", principal="User:alice", operation="READ", permission="ALLOW", pattern="LITERAL", host="*"):
    return Acl(kind, name, pattern, principal, host, operation, permission)


# ----------------------------------------------------------------------------- the rules


def decide(acls: list[Acl], operation="READ", name="orders", kind="TOPIC", principal="User:alice", host="10.0.0.1", supers=()):
    class Kept:
        def all(self):
            return acls

    return Authorizer(Kept(), supers).authorize(principal, host, operation, kind, name).allowed  # type: ignore[arg-type]


def test_no_acl_denies_and_an_allow_allows():
    assert not decide([])
    assert decide([acl()])
    assert not decide([acl()], name="other")
    assert not decide([acl()], principal="User:bob")
    assert not decide([acl()], operation="WRITE")


def test_a_deny_wins_over_any_allow():
    assert not decide([acl(), acl(permission="DENY")])
    assert not decide([acl(operation="ALL"), acl(name="ord", pattern="PREFIXED", permission="DENY")])
    assert not decide([acl(), acl(principal="User:*", name="*", permission="DENY")])


def test_prefixed_and_wildcard_resources_and_principals():
    assert decide([acl(name="ord", pattern="PREFIXED")])
    assert not decide([acl(name="ordx", pattern="PREFIXED")])
    assert not decide([acl(name="ord")])  # literal: the name itself
    assert decide([acl(name="*")], name="anything")
    assert not decide([acl(name="*", pattern="PREFIXED")], name="anything")  # a prefix "*" is the character
    assert decide([acl(principal="User:*")], principal="User:bob")


def test_hosts():
    assert decide([acl(host="10.0.0.1")])
    assert not decide([acl(host="10.0.0.2")])
    assert not decide([acl(), acl(host="10.0.0.1", permission="DENY")])
    with pytest.raises(AclError, match="IP address"):
        acl(host="example.com")


def test_implied_operations_are_allowed_never_denied():
    for op in ("READ", "WRITE", "DELETE", "ALTER"):
        assert decide([acl(operation=op)], operation="DESCRIBE"), op
    assert not decide([acl(operation="CREATE")], operation="DESCRIBE")
    assert decide([acl(operation="ALTER_CONFIGS")], operation="DESCRIBE_CONFIGS")
    assert not decide([acl(operation="DESCRIBE_CONFIGS")], operation="ALTER_CONFIGS")
    assert decide([acl(operation="ALL")], operation="ALTER_CONFIGS")
    # A denied READ does not deny DESCRIBE (Kafka: implication is for ALLOW only).
    assert decide([acl(operation="DESCRIBE"), acl(operation="READ", permission="DENY")], operation="DESCRIBE")
    assert not decide([acl(operation="ALL", permission="DENY"), acl(operation="DESCRIBE")], operation="DESCRIBE")


def test_super_users_may_do_anything_even_denied():
    denied = [acl(principal="User:root", operation="ALL", permission="DENY")]
    assert decide(denied, principal="User:root", supers=("User:root",))
    assert not decide(denied, principal="User:root")


def test_acls_are_checked_as_kafka_checks_them():
    with pytest.raises(AclError, match="CLUSTER resource is kafka-cluster"):
        acl(kind="CLUSTER", name="other")
    with pytest.raises(AclError, match="empty resource name"):
        acl(name="")
    with pytest.raises(AclError, match="principalType:principalName"):
        acl(principal="alice")
    for field, bad in (("operation", "ANY"), ("permission", "ANY"), ("pattern", "MATCH"), ("kind", "ANY"), ("operation", "Read")):
        with pytest.raises(AclError, match="Invalid"):
            acl(**{field: bad})


def test_filters_match_as_kafkas_acl_binding_filters():
    literal, prefixed, wild = acl(), acl(name="ord", pattern="PREFIXED"), acl(name="*")
    kept = [literal, prefixed, wild, acl(kind="GROUP", name="orders")]
    assert [a for a in kept if AclFilter("TOPIC", "orders", "MATCH").matches(a)] == [literal, prefixed, wild]
    assert [a for a in kept if AclFilter("TOPIC", "orders", "ANY").matches(a)] == [literal]
    assert [a for a in kept if AclFilter("ANY", "ord", "PREFIXED").matches(a)] == [prefixed]
    assert [a for a in kept if AclFilter(name="orders").matches(a)] == [literal, kept[3]]
    assert all(AclFilter().matches(a) for a in kept)
    assert not AclFilter(principal="User:bob").matches(literal)


# ----------------------------------------------------------------------------- the store


def test_the_store_keeps_each_acl_once_in_a_file_only_its_owner_reads(root):
    store = Acls(root.path)
    store.add([acl(), acl(), acl(operation="WRITE")])
    store.add([acl()])
    assert store.all() == sorted([acl(), acl(operation="WRITE")])
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(store.path)).st_mode) == 0o700
    assert Acls(root.path).all() == store.all()  # another daemon's view
    removed = store.remove([AclFilter(operation="WRITE"), AclFilter(principal="User:nobody")])
    assert removed == [[acl(operation="WRITE")], []]
    assert store.all() == [acl()]


def test_a_damaged_acl_file_denies_everything_but_to_super_users(root, caplog):
    store = Acls(root.path)
    store.add([acl()])
    with open(store.path, "w") as f:
        f.write('{"acls": [{"resource_type": "TOPIC"')
    authorizer = Authorizer(store, ("User:root",))
    with caplog.at_level(logging.ERROR, "kl.serve"):
        assert not authorizer.authorize("User:alice", "127.0.0.1", "READ", "TOPIC", "orders").allowed
        assert authorizer.authorize("User:root", "127.0.0.1", "READ", "TOPIC", "orders").allowed
    assert "the ACLs cannot be read" in caplog.text and "acls.json is damaged" in caplog.text


def kl_acls(root: kl.Root, *args: str):
    return CliRunner().invoke(cli, ["--root", root.path, "acls", *args], catch_exceptions=False)


def test_kl_acls_adds_lists_and_removes_as_kafka_acls_names_them(root):
    added = kl_acls(
        root,
        "add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Read",
        "--operation",
        "DescribeConfigs",
        "--topic",
        "orders",
        "--group",
        "g",
    )
    assert added.exit_code == 0, added.output
    assert (
        kl_acls(
            root,
            "add",
            "--deny-principal",
            "User:*",
            "--host",
            "10.1.2.3",
            "--operation",
            "all",
            "--topic",
            "pay",
            "--resource-pattern-type",
            "prefixed",
        ).exit_code
        == 0
    )
    listed = kl_acls(root, "list", "--topic", "orders")
    assert listed.output.splitlines() == [
        "TOPIC\torders\tLITERAL\tUser:alice\t*\tDESCRIBE_CONFIGS\tALLOW",
        "TOPIC\torders\tLITERAL\tUser:alice\t*\tREAD\tALLOW",
    ]
    everything = [json.loads(line) for line in kl_acls(root, "list", "--json").output.splitlines()]
    assert (
        len(everything) == 5
        and {
            "resource_type": "TOPIC",
            "name": "pay",
            "pattern": "PREFIXED",
            "principal": "User:*",
            "host": "10.1.2.3",
            "operation": "ALL",
            "permission": "DENY",
        }
        in everything
    )
    removed = kl_acls(root, "remove", "--group", "g")
    assert removed.output.splitlines() == [
        "GROUP\tg\tLITERAL\tUser:alice\t*\tDESCRIBE_CONFIGS\tALLOW",
        "GROUP\tg\tLITERAL\tUser:alice\t*\tREAD\tALLOW",
    ]
    assert len(Acls(root.path).all()) == 3
    for args, words in [
        (["add", "--allow-principal", "User:a", "--operation", "Reed", "--topic", "t"], "'Reed' is not one of"),
        (["add", "--allow-principal", "alice", "--operation", "Read", "--topic", "t"], "principalType:principalName"),
        (["add", "--allow-principal", "User:a", "--operation", "Read"], "name a resource"),
        (["remove"], "or give --all"),
    ]:
        bad = kl_acls(root, *args)
        assert bad.exit_code != 0 and words in bad.output, bad.output
    assert len(Acls(root.path).all()) == 3
    assert kl_acls(root, "remove", "--all").exit_code == 0
    assert Acls(root.path).all() == []


# ----------------------------------------------------------------------------- the daemon


@pytest.fixture
def secured(root):
    """A SASL_PLAINTEXT listener enforcing ACLs: User:admin a super user; alice may read
    and write the topic orders and read the group g; bob nothing.  The topic secret and
    the group secret-group hold data alice must never see."""
    users = Credentials(root.path)
    users.add("alice", PASSWORD, "SCRAM-SHA-256")
    users.add("bob", PASSWORD, "SCRAM-SHA-256")
    users.add("admin", ADMIN_PASSWORD, "SCRAM-SHA-256")
    for name in ("orders", "secret"):
        root.create_topic(name, kl.TopicConfig(partitions=2))
    Acls(root.path).add([acl(operation="READ"), acl(operation="WRITE"), acl(kind="GROUP", name="g", operation="READ")])
    s = InThread(root, "SASL_PLAINTEXT", acls=True, super_users=("User:admin",), allow_admin=True)
    admin = Raw(s.address).login("admin", ADMIN_PASSWORD)
    for topic in ("orders", "secret"):
        assert produce(admin, topic, [b"hidden one", b"hidden two"]) == NONE
    for group in ("g", "secret-group"):
        assert commit(admin, group, "secret", 1) == NONE
    yield s
    admin.close()
    s.stop()


def produce(conn: Raw, topic: str, vals: list[bytes]) -> int:
    part = ProduceRequest.TopicProduceData.PartitionProduceData
    data = [ProduceRequest.TopicProduceData(name=topic, partition_data=[part(index=0, records=batch(plain(vals), len(vals)))])]
    answer = conn.call(ProduceRequest, 9, ProduceResponse, transactional_id=None, acks=1, timeout_ms=1000, topic_data=data)
    return answer.responses[0].partition_responses[0].error_code


def commit(conn: Raw, group: str, topic: str, offset: int) -> int:
    """Commit as a client does: once the group's coordinator is found (as allowed)."""
    found = conn.call(FindCoordinatorRequest, 4, FindCoordinatorResponse, key_type=0, coordinator_keys=[group])
    deadline = time.monotonic() + 20
    while found.coordinators[0].error_code not in (NONE, GAF) and time.monotonic() < deadline:
        time.sleep(0.1)
        found = conn.call(FindCoordinatorRequest, 4, FindCoordinatorResponse, key_type=0, coordinator_keys=[group])
    part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    topics = [
        OffsetCommitRequest.OffsetCommitRequestTopic(
            name=topic,
            partitions=[part(partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")],
        )
    ]
    answer = conn.call(
        OffsetCommitRequest,
        9,
        OffsetCommitResponse,
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=topics,
    )
    return answer.topics[0].partitions[0].error_code


def test_the_walk_every_request_type_keeps_the_secret_topic_and_group_from_alice(root, secured, caplog):
    secret_id = topic_uuid(root.config("secret").topic_id)
    cases = walk(secret_id)
    assert {r.API_KEY for r in cases} == set(frontend.APIS), "a request type kl serves is not walked"
    before = {p: root.log("secret", p).counted().log_end_count for p in (0, 1)}
    alice = Raw(secured.address).login("alice", PASSWORD)
    with caplog.at_level(logging.WARNING, "kl.serve"):
        for request, case in cases.items():
            if case is None:
                continue
            version, response, fields, check = case
            answer = alice.call(request, version, response, **fields)
            assert check(answer), f"{request.__name__} v{version}: {answer}"
            if request not in (DeleteTopicsRequest, MetadataRequest, CreateTopicsRequest):  # those echo the names asked
                assert b"hidden" not in alice.last and (b"secret" not in alice.last or _echoes(request)), request.__name__
        assert produce(alice, "secret", [b"mine"]) == TAF
        assert commit(alice, "g", "secret", 0) == TAF
        assert commit(alice, "secret-group", "orders", 0) == GAF
        # What alice may do, she does.
        assert produce(alice, "orders", [b"mine"]) == NONE
        assert commit(alice, "g", "orders", 1) == NONE
        listed = alice.call(
            MetadataRequest,
            12,
            MetadataResponse,
            topics=None,
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=True,
        )
        assert [t.name for t in listed.topics] == ["orders"] and b"secret" not in alice.last
        assert listed.topics[0].authorized_operations == {3, 4, 8}  # READ, WRITE and the DESCRIBE they imply
    assert {p: root.log("secret", p).counted().log_end_count for p in (0, 1)} == before
    assert root.config("secret").partitions == 2 and "secret-new" not in root.topics()
    admin = Raw(secured.address).login("admin", ADMIN_PASSWORD)
    fetched = admin.call(
        OffsetFetchRequest,
        8,
        OffsetFetchResponse,
        groups=[OffsetFetchRequest.OffsetFetchRequestGroup(group_id=g, topics=None) for g in ("g", "secret-group")],
        require_stable=False,
    )
    assert [[(t.name, t.partitions[0].committed_offset) for t in g.topics] for g in fetched.groups] == [
        [("orders", 1), ("secret", 1)],
        [("secret", 1)],
    ]
    denials = [r.getMessage() for r in caplog.records if " denied " in r.getMessage()]
    assert any(
        "User:alice denied READ on topic 'secret'" in d and "no ACL allows it" in d and d.startswith("127.0.0.1:")
        for d in denials
    )
    assert any("User:alice denied READ on group 'secret-group'" in d for d in denials)
    assert any("User:alice denied ALTER on cluster 'kafka-cluster'" in d for d in denials)
    assert not any("'orders'" in d or "'g'" in d for d in denials)


def _echoes(request) -> bool:
    """Request types whose answers name the resources asked for (as Kafka's do)."""
    return request in (
        FetchRequest,
        ListOffsetsRequest,
        OffsetFetchRequest,
        FindCoordinatorRequest,
        DescribeGroupsRequest,
        DeleteGroupsRequest,
        DescribeConfigsRequest,
        AlterConfigsRequest,
        IncrementalAlterConfigsRequest,
        DeleteRecordsRequest,
        CreatePartitionsRequest,
        DescribeProducersRequest,
        DescribeTransactionsRequest,
        AddPartitionsToTxnRequest,
        OffsetDeleteRequest,
        ElectLeadersRequest,
    )


def test_a_denial_is_logged_once_a_minute_with_the_count(root, secured, caplog):
    alice = Raw(secured.address).login("alice", PASSWORD)
    with caplog.at_level(logging.WARNING, "kl.serve"):
        for _ in range(5):
            assert produce(alice, "secret", [b"x"]) == TAF
    denials = [r.getMessage() for r in caplog.records if "denied WRITE on topic 'secret'" in r.getMessage()]
    assert len(denials) == 1 and "User:alice" in denials[0]


def test_without_acls_the_acl_requests_answer_security_disabled(root):
    s = InThread(root)
    try:
        conn = Raw(s.address)
        answer = conn.call(
            DescribeAclsRequest,
            3,
            DescribeAclsResponse,
            **acl_filter(),
        )
        assert answer.error_code == SECURITY_DISABLED
        root.create_topic("t", kl.TopicConfig())
        assert produce(conn, "t", [b"anyone may"]) == NONE  # no authorizer: today's behaviour
    finally:
        s.stop()


def test_acls_made_through_one_daemon_bind_another_over_the_root(root, secured):
    other = InThread(root, "SASL_PLAINTEXT", acls=True, super_users=("User:admin",))
    try:
        bob = Raw(other.address).login("bob", PASSWORD)
        assert produce(bob, "orders", [b"b"]) == TAF
        admin = Raw(secured.address).login("admin", ADMIN_PASSWORD)
        made = admin.call(
            CreateAclsRequest,
            3,
            CreateAclsResponse,
            creations=[creation(2, "ord", 4, "User:bob", "127.0.0.1", 4)],
        )
        assert made.results[0].error_code == NONE
        time.sleep(RECHECK_SECONDS + 0.2)
        assert produce(bob, "orders", [b"b"]) == NONE
        gone = admin.call(
            DeleteAclsRequest,
            3,
            DeleteAclsResponse,
            filters=[DeleteAclsRequest.DeleteAclsFilter(**acl_filter(2, "orders", 2, "User:bob"))],
        )
        assert [(m.resource_name, m.pattern_type, m.operation) for m in gone.filter_results[0].matching_acls] == [("ord", 4, 4)]
        time.sleep(RECHECK_SECONDS + 0.2)
        assert produce(bob, "orders", [b"b"]) == TAF
        bad = admin.call(
            CreateAclsRequest,
            3,
            CreateAclsResponse,
            creations=[creation(4, "not-the-cluster", 3, "User:bob", "*", 7)],
        )
        assert bad.results[0].error_code == INVALID_REQUEST
        assert "The only valid name for the CLUSTER resource is kafka-cluster" in bad.results[0].error_message
    finally:
        other.stop()


def test_confluent_kafka_reads_and_writes_what_its_acls_allow_and_no_more(root, secured):
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    def config(**extra):
        return {
            "bootstrap.servers": secured.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": "alice",
            "sasl.password": PASSWORD,
            **extra,
        }

    assert sorted(AdminClient(config()).list_topics(timeout=20).topics) == ["orders"]
    reports = {}
    producer = Producer(config(**{"message.timeout.ms": 10000}))
    for topic, value in (("orders", b"allowed"), ("secret", b"denied")):
        producer.produce(topic, value, on_delivery=lambda err, msg: reports.update({msg.value(): err}))
    assert producer.flush(30) == 0
    assert reports[b"allowed"] is None and reports[b"denied"].name() == "TOPIC_AUTHORIZATION_FAILED"
    consumer = Consumer(config(**{"group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    consumer.subscribe(["orders"])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        m = consumer.poll(1)
        if m is not None and m.error() is None:
            got.append(m.value())
    consumer.close()
    assert b"allowed" in got and b"denied" not in got
    other = Consumer(config(**{"group.id": "secret-group", "auto.offset.reset": "earliest"}))
    other.subscribe(["orders"])
    deadline = time.monotonic() + 30
    error = None
    while error is None and time.monotonic() < deadline:
        try:
            m = other.poll(1)
        except KafkaException as e:
            error = e.args[0]
        else:
            error = m.error() if m is not None and m.error() is not None else None
    other.close()
    assert error is not None and error.name() == "GROUP_AUTHORIZATION_FAILED"


@pytest.fixture(scope="module")
def kafka_lib():
    """Kafka's jars (its tools), or a skip saying why they cannot be had here."""
    try:
        return install()
    except Unavailable as e:
        pytest.skip(f"Apache Kafka: {e}")


def test_kafka_acls_adds_lists_and_removes_through_kl(root, secured, kafka_lib, tmp_path):

    admin = tmp_path / "admin.properties"
    admin.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\nsasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="admin" password="{ADMIN_PASSWORD}";\n'
    )
    acls = ["org.apache.kafka.tools.AclCommand", "--bootstrap-server", secured.bootstrap, "--command-config", str(admin)]
    tool(
        kafka_lib,
        *acls,
        "--add",
        "--allow-principal",
        "User:carol",
        "--operation",
        "Read",
        "--operation",
        "Describe",
        "--topic",
        "reports",
        "--resource-pattern-type",
        "prefixed",
    )
    listed = tool(kafka_lib, *acls, "--list", "--topic", "reports-2026", "--resource-pattern-type", "match")
    assert "ResourcePattern(resourceType=TOPIC, name=reports, patternType=PREFIXED)" in listed
    assert "(principal=User:carol, host=*, operation=READ, permissionType=ALLOW)" in listed
    assert sorted(a.operation for a in Acls(root.path).all() if a.principal == "User:carol") == ["DESCRIBE", "READ"]
    tool(
        kafka_lib,
        *acls,
        "--remove",
        "--force",
        "--allow-principal",
        "User:carol",
        "--operation",
        "Read",
        "--topic",
        "reports",
        "--resource-pattern-type",
        "prefixed",
    )
    assert [a.operation for a in Acls(root.path).all() if a.principal == "User:carol"] == ["DESCRIBE"]


def test_kl_serve_takes_acls_and_super_users_and_refuses_a_bad_principal(root):
    bad = subprocess.run(
        [*KL, "--root", root.path, "serve", "--kafka", "127.0.0.1:0", "--acls", "--super-user", "admin"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "principalType:principalName" in bad.stderr and "Traceback" not in bad.stderr


def test_kafka07_port_under_mtls_reads_writes_and_lists_what_the_acls_allow(root, tmp_path, caplog):
    import ssl
    import threading

    import trustme

    from kl.net.daemon import Daemon
    from kl.net.remote import RemoteRoot
    from kl.net.server import ServeConfig

    ca = trustme.CA()
    pems = {}
    server_cert = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("alice@example.com", common_name="alice", organization_name="Example")
    files = {"ca": ca.cert_pem, "cert": server_cert.cert_chain_pems[0], "key": server_cert.private_key_pem,
             "client": client.cert_chain_pems[0], "client_key": client.private_key_pem}  # fmt: skip
    for name, blob in files.items():
        blob.write_to_path(str(tmp_path / f"{name}.pem"))
        pems[name] = str(tmp_path / f"{name}.pem")
    for name in ("orders", "secret"):
        root.create_topic(name, kl.TopicConfig())
    Acls(root.path).add([acl(operation="READ"), acl(operation="WRITE")])
    rules = r"RULE:^CN=([^,]*),.*$/$1/"
    config = ServeConfig(port=0, port_tls=True, allow_produce=True, tls_cert=pems["cert"], tls_key=pems["key"], tls_ca=pems["ca"],
                         tls_client_auth="required", tls_principal_rules=rules, acls=True)  # fmt: skip
    server = Daemon(root, config)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        context = ssl.create_default_context(cafile=pems["ca"])
        context.load_cert_chain(pems["client"], pems["client_key"])
        remote = RemoteRoot(f"127.0.0.1:{server.port}", tls=context)
        assert remote.topics() == ["orders"]
        with kl.RemoteProducer(remote) as producer:
            producer.send_batch("orders", [b"mine"], partition=0)
            with pytest.raises(kl.KlError, match=r"User:alice may not (describe|write) topic secret"):
                producer.send_batch("secret", [b"not mine"], partition=0)
        with kl.RemoteConsumer(RemoteRoot(f"127.0.0.1:{server.port}", tls=context)) as consumer:
            assert [m.value for m in consumer.fetch("orders", 0, 0, 1 << 20)] == [b"mine"]
            with (
                caplog.at_level(logging.WARNING, "kl.serve"),
                pytest.raises(kl.KlError, match=r"may not (describe|read) topic secret"),
            ):
                consumer.fetch("secret", 0, 0, 1 << 20)
        assert root.log("secret", 0).counted().log_end_count == 0
        assert any("User:alice denied " in r.getMessage() and "topic 'secret'" in r.getMessage() for r in caplog.records)
    finally:
        server.stop()
        thread.join(10)
