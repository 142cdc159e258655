"""Every request type ``kl serve --kafka`` serves, as a client would send it naming one
topic, one group and one transactional id: ``walk`` gives, by request class, (version,
response class, the request's fields, a check of the answer an ACL walk expects: the
principal may not touch them).  tests/test_acls.py walks them as a principal denied
those resources; tests/test_hostile_names.py with hostile names."""

from __future__ import annotations

import uuid

from kafka.protocol.admin.acl import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)
from kafka.protocol.admin.client_quotas import DescribeClientQuotasRequest, DescribeClientQuotasResponse
from kafka.protocol.admin.cluster import (
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.admin.groups import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.admin.topics import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)
from kafka.protocol.admin.transactions import (
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.admin.users import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
)
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse
from kafkafuzz import fetch_fields

from kl.net.kafka.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    ILLEGAL_SASL_STATE,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)

TAF, GAF, CAF = TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED
XAF = TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def creation(kind: int, name: str, pattern: int, principal: str, host: str, operation: int) -> CreateAclsRequest.AclCreation:
    """An ALLOW binding to create (Kafka's codes)."""
    return CreateAclsRequest.AclCreation(
        resource_type=kind,
        resource_name=name,
        resource_pattern_type=pattern,
        principal=principal,
        host=host,
        operation=operation,
        permission_type=3,
    )


def acl_filter(kind: int = 1, name: str | None = None, pattern: int = 1, principal: str | None = None) -> dict:
    """The fields of a DescribeAcls request or a DeleteAcls filter (1: ANY)."""
    return dict(
        resource_type_filter=kind,
        resource_name_filter=name,
        pattern_type_filter=pattern,
        principal_filter=principal,
        host_filter=None,
        operation=1,
        permission_type=1,
    )


def alter_change(cls, topic: str) -> list:
    resource = cls.AlterConfigsResource
    extra = {"config_operation": 0} if cls is IncrementalAlterConfigsRequest else {}
    return [
        resource(
            resource_type=2, resource_name=topic, configs=[resource.AlterableConfig(name="retention.ms", value="1", **extra)]
        )
    ]


def walk(secret_id: uuid.UUID, topic: str = "secret", group: str = "secret-group", tx: str = "secret-tx") -> dict:
    """For each request type kl serves: (version, request, response, fields of a request
    of alice's that names the secret topic or group (or of one that names none and could
    list them), a check of the answer)."""
    P = "User:alice"

    def first_topic_code(a):
        return a.topics[0].partitions[0].error_code

    return {
        ApiVersionsRequest: (
            3,
            ApiVersionsResponse,
            dict(client_software_name="walk", client_software_version="1"),
            lambda a: a.error_code == NONE,
        ),
        ProduceRequest: None,  # by produce(): below
        FetchRequest: (
            16,
            FetchResponse,
            fetch_fields(None, 0, topic_id=secret_id),
            lambda a: a.responses[0].partitions[0].error_code == TAF and not a.responses[0].partitions[0].records,
        ),
        ListOffsetsRequest: (
            6,
            ListOffsetsResponse,
            dict(
                replica_id=-1,
                isolation_level=0,
                topics=[
                    ListOffsetsRequest.ListOffsetsTopic(
                        name=topic,
                        partitions=[
                            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                                partition_index=0, timestamp=-1, current_leader_epoch=-1
                            )
                        ],
                    )
                ],
            ),
            lambda a: first_topic_code(a) == TAF and a.topics[0].partitions[0].offset == -1,
        ),
        MetadataRequest: (
            12,
            MetadataResponse,
            dict(
                topics=[
                    MetadataRequest.MetadataRequestTopic(name=topic),
                    MetadataRequest.MetadataRequestTopic(name="not-there"),
                ],
                allow_auto_topic_creation=True,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=True,
            ),
            lambda a: [(t.error_code, t.partitions) for t in a.topics] == [(TAF, []), (TAF, [])],
        ),
        OffsetCommitRequest: None,  # by commit(): below
        OffsetFetchRequest: (
            8,
            OffsetFetchResponse,
            dict(
                groups=[
                    OffsetFetchRequest.OffsetFetchRequestGroup(group_id="g", topics=None),
                    OffsetFetchRequest.OffsetFetchRequestGroup(
                        group_id="g",
                        topics=[
                            OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name=topic, partition_indexes=[0])
                        ],
                    ),
                    OffsetFetchRequest.OffsetFetchRequestGroup(group_id=group, topics=None),
                ],
                require_stable=False,
            ),
            lambda a: (
                a.groups[0].topics == []
                and a.groups[0].error_code == NONE
                and a.groups[1].topics[0].partitions[0].error_code == TAF
                and a.groups[1].topics[0].partitions[0].committed_offset == -1
                and a.groups[2].error_code == GAF
            ),
        ),
        FindCoordinatorRequest: (
            4,
            FindCoordinatorResponse,
            dict(key_type=0, coordinator_keys=[group]),
            lambda a: a.coordinators[0].error_code == GAF and a.coordinators[0].node_id == -1,
        ),
        JoinGroupRequest: (
            9,
            JoinGroupResponse,
            dict(
                group_id=group,
                session_timeout_ms=10000,
                rebalance_timeout_ms=10000,
                member_id="",
                group_instance_id=None,
                protocol_type="consumer",
                protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
                reason=None,
            ),
            lambda a: a.error_code == GAF and a.members == [],
        ),
        HeartbeatRequest: (
            4,
            HeartbeatResponse,
            dict(group_id=group, generation_id=1, member_id="m", group_instance_id=None),
            lambda a: a.error_code == GAF,
        ),
        LeaveGroupRequest: (
            5,
            LeaveGroupResponse,
            dict(
                group_id=group,
                members=[LeaveGroupRequest.MemberIdentity(member_id="m", group_instance_id=None, reason=None)],
            ),
            lambda a: a.error_code == GAF,
        ),
        SyncGroupRequest: (
            5,
            SyncGroupResponse,
            dict(
                group_id=group,
                generation_id=1,
                member_id="m",
                group_instance_id=None,
                protocol_type="consumer",
                protocol_name="range",
                assignments=[],
            ),
            lambda a: a.error_code == GAF and a.assignment == b"",
        ),
        DescribeGroupsRequest: (
            5,
            DescribeGroupsResponse,
            dict(groups=[group], include_authorized_operations=True),
            lambda a: a.groups[0].error_code == GAF and a.groups[0].members == [],
        ),
        ListGroupsRequest: (
            5,
            ListGroupsResponse,
            dict(states_filter=[], types_filter=[]),
            lambda a: a.error_code == NONE and [g.group_id for g in a.groups] in ([], ["g"]),
        ),
        SaslHandshakeRequest: (1, SaslHandshakeResponse, dict(mechanism="PLAIN"), lambda a: a.error_code == ILLEGAL_SASL_STATE),
        SaslAuthenticateRequest: (
            2,
            SaslAuthenticateResponse,
            dict(auth_bytes=b"\0admin\0admin's password"),
            lambda a: a.error_code == ILLEGAL_SASL_STATE,
        ),
        CreateTopicsRequest: (
            7,
            CreateTopicsResponse,
            dict(
                topics=[
                    CreateTopicsRequest.CreatableTopic(
                        name=f"{topic}-new", num_partitions=1, replication_factor=-1, assignments=[], configs=[]
                    )
                ],
                timeout_ms=1000,
                validate_only=False,
            ),
            lambda a: a.topics[0].error_code == TAF,
        ),
        DeleteTopicsRequest: (
            6,
            DeleteTopicsResponse,
            dict(
                timeout_ms=1000,
                topics=[
                    DeleteTopicsRequest.DeleteTopicState(name=topic),
                    DeleteTopicsRequest.DeleteTopicState(topic_id=secret_id),
                ],
            ),
            lambda a: [(r.name, r.error_code) for r in a.responses] == [(topic, TAF), (None, TAF)],
        ),
        DeleteRecordsRequest: (
            2,
            DeleteRecordsResponse,
            dict(
                timeout_ms=1000,
                topics=[
                    DeleteRecordsRequest.DeleteRecordsTopic(
                        name=topic,
                        partitions=[DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=-1)],
                    )
                ],
            ),
            lambda a: first_topic_code(a) == TAF,
        ),
        InitProducerIdRequest: (
            4,
            InitProducerIdResponse,
            dict(transactional_id=tx, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1),
            lambda a: a.error_code == XAF,
        ),
        AddPartitionsToTxnRequest: (
            5,
            AddPartitionsToTxnResponse,
            dict(
                transactions=[
                    AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction(
                        transactional_id=tx, producer_id=1, producer_epoch=0, verify_only=False, topics=[]
                    )
                ]
            ),
            lambda a: a.error_code == CAF and a.results_by_transaction == [],  # (from v4 a broker's request: CLUSTER_ACTION)
        ),
        AddOffsetsToTxnRequest: (
            4,
            AddOffsetsToTxnResponse,
            dict(transactional_id=tx, producer_id=1, producer_epoch=0, group_id=group),
            lambda a: a.error_code == XAF,
        ),
        EndTxnRequest: (
            5,
            EndTxnResponse,
            dict(transactional_id=tx, producer_id=1, producer_epoch=0, committed=True),
            lambda a: a.error_code == XAF,
        ),
        TxnOffsetCommitRequest: (
            5,
            TxnOffsetCommitResponse,
            dict(
                transactional_id=tx,
                group_id=group,
                producer_id=1,
                producer_epoch=0,
                generation_id=-1,
                member_id="",
                group_instance_id=None,
                topics=[],
            ),
            lambda a: a.topics == [],
        ),
        DescribeAclsRequest: (
            3,
            DescribeAclsResponse,
            acl_filter(),
            lambda a: a.error_code == CAF and a.resources == [],
        ),
        CreateAclsRequest: (
            3,
            CreateAclsResponse,
            dict(creations=[creation(2, topic, 3, P, "*", 3)]),
            lambda a: a.results[0].error_code == CAF,
        ),
        DeleteAclsRequest: (
            3,
            DeleteAclsResponse,
            dict(filters=[DeleteAclsRequest.DeleteAclsFilter(**acl_filter())]),
            lambda a: a.filter_results[0].error_code == CAF,
        ),
        DescribeConfigsRequest: (
            4,
            DescribeConfigsResponse,
            dict(
                resources=[
                    DescribeConfigsRequest.DescribeConfigsResource(resource_type=2, resource_name=topic, configuration_keys=None),
                    DescribeConfigsRequest.DescribeConfigsResource(resource_type=4, resource_name="", configuration_keys=None),
                ],
                include_synonyms=True,
                include_documentation=False,
            ),
            lambda a: [(r.error_code, r.configs) for r in a.results] == [(TAF, []), (CAF, [])],
        ),
        AlterConfigsRequest: (
            2,
            AlterConfigsResponse,
            dict(resources=alter_change(AlterConfigsRequest, topic), validate_only=False),
            lambda a: a.responses[0].error_code == TAF,
        ),
        DescribeLogDirsRequest: (
            5,
            DescribeLogDirsResponse,
            dict(topics=None),
            lambda a: a.error_code == CAF and a.results == [],
        ),
        CreatePartitionsRequest: (
            3,
            CreatePartitionsResponse,
            dict(
                topics=[CreatePartitionsRequest.CreatePartitionsTopic(name=topic, count=5, assignments=None)],
                timeout_ms=1000,
                validate_only=False,
            ),
            lambda a: a.results[0].error_code == TAF,
        ),
        DeleteGroupsRequest: (
            2,
            DeleteGroupsResponse,
            dict(groups_names=[group]),
            lambda a: a.results[0].error_code == GAF,
        ),
        ElectLeadersRequest: (
            2,
            ElectLeadersResponse,
            dict(
                election_type=0,
                topic_partitions=[ElectLeadersRequest.TopicPartitions(topic=topic, partitions=[0])],
                timeout_ms=1000,
            ),
            lambda a: a.error_code == CAF,
        ),
        IncrementalAlterConfigsRequest: (
            1,
            IncrementalAlterConfigsResponse,
            dict(resources=alter_change(IncrementalAlterConfigsRequest, topic), validate_only=False),
            lambda a: a.responses[0].error_code == TAF,
        ),
        AlterPartitionReassignmentsRequest: (
            1,
            AlterPartitionReassignmentsResponse,
            dict(timeout_ms=1000, allow_replication_factor_change=True, topics=[]),
            lambda a: a.error_code == CAF,
        ),
        ListPartitionReassignmentsRequest: (
            0,
            ListPartitionReassignmentsResponse,
            dict(timeout_ms=1000, topics=None),
            lambda a: a.error_code == CAF,
        ),
        OffsetDeleteRequest: (
            0,
            OffsetDeleteResponse,
            dict(
                group_id=group,
                topics=[
                    OffsetDeleteRequest.OffsetDeleteRequestTopic(
                        name=topic,
                        partitions=[OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=0)],
                    )
                ],
            ),
            lambda a: a.error_code == GAF,
        ),
        DescribeClientQuotasRequest: (
            1,
            DescribeClientQuotasResponse,
            dict(components=[], strict=False),
            lambda a: a.error_code == CAF,
        ),
        DescribeUserScramCredentialsRequest: (
            0,
            DescribeUserScramCredentialsResponse,
            dict(users=[]),
            lambda a: a.error_code == CAF and a.results == [],
        ),
        AlterUserScramCredentialsRequest: (
            0,
            AlterUserScramCredentialsResponse,
            dict(deletions=[AlterUserScramCredentialsRequest.ScramCredentialDeletion(name="admin", mechanism=1)], upsertions=[]),
            lambda a: a.results[0].error_code == CAF,
        ),
        DescribeClusterRequest: (
            2,
            DescribeClusterResponse,
            dict(include_cluster_authorized_operations=True, endpoint_type=1, include_fenced_brokers=False),
            lambda a: a.error_code == NONE and a.authorized_operations == set(),
        ),
        DescribeProducersRequest: (
            0,
            DescribeProducersResponse,
            dict(topics=[DescribeProducersRequest.TopicRequest(name=topic, partition_indexes=[0])]),
            lambda a: a.topics[0].partitions[0].error_code == TAF,
        ),
        DescribeTransactionsRequest: (
            0,
            DescribeTransactionsResponse,
            dict(transactional_ids=[tx]),
            lambda a: a.transaction_states[0].error_code == XAF,
        ),
        ListTransactionsRequest: (
            2,
            ListTransactionsResponse,
            dict(state_filters=[], producer_id_filters=[], duration_filter=-1, transactional_id_pattern=None),
            lambda a: a.transaction_states == [],
        ),
    }
