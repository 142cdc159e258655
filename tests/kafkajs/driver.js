// Drives KafkaJS, unmodified, for one operation against kl serve --kafka; JSON lines on stdout.
//
//   node driver.js SPEC_FILE      (NODE_PATH: the node_modules npm ci made from the lock beside)
//
// The operations and their JSON are tests/kafka_driver.py's (keys, values and header values
// as base64): produce (its offsets: KafkaJS reports one base offset per partition, so every
// record of a send gets that base), offsets ({"earliest", "latest"} or the offset of
// "timestamp", through the admin client), watch, and group: KafkaJS has no assign(), its
// consumer always joins a group (subscribe and run, auto-commit, the round-robin assignor it
// has, from the beginning where nothing is committed), printing its assignment on each join
// ({"assignment": [[topic, partition], ...], "why": "assign"}), each message ({topic,
// partition, offset, value}, value as text), and {"closed": N} once it has left the group on
// "close" (or the end) on stdin.  Snappy is the kafkajs-snappy codec;
// LZ4 is lz4js (pure JavaScript) registered as KafkaJS asks; zstd has no codec that installs
// without a native build.  Fails (exit 1, the reason on stderr) after spec.timeout seconds.
'use strict'

const fs = require('fs')
const readline = require('readline')
const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require('kafkajs')
const SnappyCodec = require('kafkajs-snappy')
const lz4js = require('lz4js')

CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec
CompressionCodecs[CompressionTypes.LZ4] = () => ({
  compress: async (encoder) => Buffer.from(lz4js.compress(encoder.buffer)),
  decompress: async (buffer) => Buffer.from(lz4js.decompress(buffer)),
})

const CODECS = { gzip: CompressionTypes.GZIP, snappy: CompressionTypes.Snappy, lz4: CompressionTypes.LZ4 }

const spec = JSON.parse(fs.readFileSync(process.argv[2]))
const out = (fields) => process.stdout.write(JSON.stringify(fields) + '\n')
const raw = (text) => (text === null || text === undefined ? null : Buffer.from(text, 'base64'))

let lastError = null
const timer = setTimeout(() => {
  process.stderr.write(`kafkajs ${spec.op}: timed out after ${spec.timeout} s; last error: ${lastError && (lastError.stack || lastError)}\n`)
  process.exit(1)
}, spec.timeout * 1000)

// spec.security, where given: {protocol, ca, cert, key, mechanism, user, password}, as
// KafkaJS takes TLS (its ssl: the CA, and a client certificate for mTLS) and SASL.
const security = spec.security || {}
const tls = security.protocol === 'SSL' || security.protocol === 'SASL_SSL'
const kafka = new Kafka({
  clientId: 'kl-tests',
  brokers: [spec.bootstrap],
  logLevel: logLevel.ERROR,
  retry: { retries: 2, initialRetryTime: 50 },
  requestTimeout: spec.timeout * 1000,
  ssl: tls ? { ca: [fs.readFileSync(security.ca)], ...(security.cert ? { cert: fs.readFileSync(security.cert), key: fs.readFileSync(security.key) } : {}) } : undefined,
  sasl: security.mechanism ? { mechanism: security.mechanism.toLowerCase(), username: security.user, password: security.password } : undefined,
})

async function produce () {
  const producer = kafka.producer({ idempotent: !!spec.idempotent, allowAutoTopicCreation: false, maxInFlightRequests: spec.idempotent ? 1 : undefined })
  await producer.connect()
  const messages = spec.records.map((r) => {
    const message = { key: raw(r.key), value: raw(r.value), partition: spec.partition }
    if (r.timestamp) message.timestamp = String(r.timestamp)
    if (r.headers && r.headers.length) {
      message.headers = {}
      for (const [key, value] of r.headers) message.headers[key] = raw(value)
    }
    return message
  })
  const acks = spec.acks === undefined ? -1 : spec.acks
  const compression = spec.compression ? CODECS[spec.compression] : CompressionTypes.None
  if (compression === undefined) throw new Error(`no codec ${spec.compression}`)
  const answer = await producer.send({ topic: spec.topic, acks, compression, messages })
  out({ offsets: messages.map(() => (answer.length ? Number(answer[0].baseOffset) : null)) })  // none with acks=0
  await producer.disconnect()
}

async function offsets () {
  const admin = kafka.admin()
  await admin.connect()
  const [earliestLatest] = (await admin.fetchTopicOffsets(spec.topic)).filter((p) => p.partition === spec.partition)
  const answer = { earliest: Number(earliestLatest.low), latest: Number(earliestLatest.high) }
  if (spec.timestamp !== undefined) {
    const [found] = (await admin.fetchTopicOffsetsByTimestamp(spec.topic, spec.timestamp)).filter((p) => p.partition === spec.partition)
    answer.timestamp = Number(found.offset)
  }
  out(answer)
  await admin.disconnect()
}

async function watch () {
  const admin = kafka.admin()
  await admin.connect()
  out({ topics: (await admin.listTopics()).sort() })
  await new Promise((resolve) => readline.createInterface({ input: process.stdin }).once('line', resolve))
  for (;;) {
    try {
      const { topics } = await admin.fetchTopicMetadata({ topics: [spec.topic] })
      out({ partitions: topics[0].partitions.length })
      break
    } catch (e) {
      lastError = e
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  }
  await admin.disconnect()
}

async function group () {
  const consumer = kafka.consumer({
    groupId: spec.group,
    sessionTimeout: (spec.session_timeout || 10) * 1000,
    heartbeatInterval: 1000,
    metadataMaxAge: 1000,
    maxWaitTimeInMs: 100,
  })
  consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
    const assignment = []
    for (const [topic, partitions] of Object.entries(payload.memberAssignment)) {
      for (const partition of partitions) assignment.push([topic, partition])
    }
    out({ assignment: assignment.sort(), why: 'assign' })
  })
  await consumer.connect()
  const topics = spec.pattern ? [new RegExp(spec.pattern)] : spec.topics
  await consumer.subscribe({ topics, fromBeginning: true })
  let read = 0
  await consumer.run({
    eachMessage: async ({ topic, partition, message }) => {
      read += 1
      out({ topic, partition, offset: Number(message.offset), value: message.value === null ? null : message.value.toString() })
    },
  })
  await new Promise((resolve) => {
    const lines = readline.createInterface({ input: process.stdin })
    lines.on('line', (line) => line.trim() === 'close' && resolve())
    lines.on('close', resolve)
  })
  await consumer.disconnect()
  out({ closed: read })
}

// admin: a topic's life through KafkaJS's admin client, step by step as the Java and Go
// drivers take it (tests/kafka-java/src/AdminOps.java), each step observed on its own (a
// step that fails is {"error": the error's type, or its name}), printed as one JSON line.
// KafkaJS alters configs with AlterConfigs, which sets a resource's configs whole: "altered"
// sets retention.ms alone, so max.message.bytes returns to its default.  It has no way to
// delete a group's offsets: "groups" sets offset 4 for the group, fetches and deletes it.
async function admin () {
  const { ConfigResourceTypes } = require('kafkajs')
  const client = kafka.admin()
  await client.connect()
  const topic = spec.topic
  const group = `${topic}-group`
  const resource = { type: ConfigResourceTypes.TOPIC, name: topic }
  const seen = {}
  const step = async (name, fn) => {
    try {
      seen[name] = await fn()
    } catch (e) {
      seen[name] = { error: e.type || e.name }
    }
  }
  const created = async () => client.createTopics({
    topics: [{ topic, numPartitions: 2, replicationFactor: 1, configEntries: [{ name: 'retention.ms', value: '3600000' }] }],
    waitForLeaders: true,
  })
  const partitions = async () => (await client.fetchTopicMetadata({ topics: [topic] })).topics[0].partitions
    .map((p) => [p.partitionId, p.replicas.length, p.isr.length]).sort((a, b) => a[0] - b[0])
  const configs = async (...names) => {
    const { resources } = await client.describeConfigs({ resources: [{ ...resource, configNames: names }], includeSynonyms: false })
    const found = {}
    for (const name of names) found[name] = null
    for (const e of resources[0].configEntries) found[e.configName] = [e.configValue, e.isDefault, e.readOnly]
    return found
  }
  await step('create', created)
  await step('again', created)
  await step('listed', async () => (await client.listTopics()).includes(topic))
  await step('described', partitions)
  await step('grown', async () => {
    await client.createPartitions({ topicPartitions: [{ topic, count: 3 }] })
    for (const end = Date.now() + 10000; (await partitions()).length < 3 && Date.now() < end;) {
      await new Promise((resolve) => setTimeout(resolve, 50))  // Kafka's broker has them once its metadata does
    }
    return (await partitions()).length
  })
  await step('configs', () => configs('retention.ms', 'max.message.bytes', 'cleanup.policy'))
  await step('altered', async () => {
    await client.alterConfigs({ resources: [{ ...resource, configEntries: [{ name: 'retention.ms', value: '7200000' }] }] })
    return configs('retention.ms', 'max.message.bytes')
  })
  await step('records', async () => {
    const producer = kafka.producer({ allowAutoTopicCreation: false })
    await producer.connect()
    await producer.send({ topic, acks: -1, messages: [0, 1, 2, 3, 4, 5].map((i) => ({ value: `v${i}`, partition: 0 })) })
    await producer.disconnect()
    await client.deleteTopicRecords({ topic, partitions: [{ partition: 0, offset: '2' }] })
    return Number((await client.fetchTopicOffsets(topic)).find((p) => p.partition === 0).low)
  })
  await step('groups', async () => {
    await client.setOffsets({ groupId: group, topic, partitions: [{ partition: 0, offset: '4' }] })
    const listed = (await client.listGroups()).groups.some((g) => g.groupId === group)
    const [{ partitions: offsets }] = await client.fetchOffsets({ groupId: group, topics: [topic] })
    await client.deleteGroups([group])
    return { listed, offsets: offsets.map((p) => [p.partition, Number(p.offset)]).sort((a, b) => a[0] - b[0]) }
  })
  await step('deleted', async () => {
    await client.deleteTopics({ topics: [topic] })
    return (await client.listTopics()).includes(topic)
  })
  out(seen)
  await client.disconnect()
}

const ops = { produce, offsets, watch, group, admin }
if (!ops[spec.op]) {
  process.stderr.write(`unknown op ${spec.op}\n`)
  process.exit(1)
}
ops[spec.op]().then(
  () => {
    clearTimeout(timer)
    process.exit(0)
  },
  (e) => {
    process.stderr.write(`kafkajs ${spec.op}: ${e.stack || e}\n`)
    process.exit(1)
  }
)
