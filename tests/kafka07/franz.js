// franz-kafka (npm, unmodified) against kl serve: one operation per run.
//
//   node franz.js '{"op": "consume", "port": 9092, "topic": "t", ...}'
//
// Prints one JSON object on stdout and exits 0; exits 1 on an error the operation did
// not expect, 2 when it is not done within "timeout" ms.  Payloads go as base64.
//   consume  {topic, partition, offset, count, maxFetchSize}: the Topic stream API
//            -> {messages, next}: the payloads and the offset the client goes on from
//   produce  {topic, partitions, messages, compression}: Topic.write of every message
//            (one batch), then OFFSETS requests on the same connection until a
//            partition's latest offset moves (PRODUCE has no answer)
//            -> {before, latest}: each partition's latest offset before and after
//   offsets  {topic, partition, time, max} -> {offsets}
//   fetch    {topic, partition, offset, maxFetchSize}: one FETCH of a Partition
//            -> {error, messages, next}: the error's message or null, the complete
//            messages' payloads and the offset the client continues from
'use strict'
var Kafka = require('franz-kafka')

var spec = JSON.parse(process.argv[2])
var timer = setTimeout(function () {
	process.stderr.write('franz.js: ' + spec.op + ' not done within ' + spec.timeout + ' ms\n')
	process.exit(2)
}, spec.timeout || 10000)

function done(result) {
	clearTimeout(timer)
	process.stdout.write(JSON.stringify(result) + '\n', function () { process.exit(0) })
}

function fail(message) {
	process.stderr.write('franz.js: ' + message + '\n')
	process.exit(1)
}

var kafka = new Kafka({
	brokers: [{ id: 0, host: '127.0.0.1', port: spec.port }],
	compression: spec.compression || 'none',
	batchSize: spec.messages ? spec.messages.length : 200,
	queueTime: 20,
	minFetchDelay: 0,
	maxFetchDelay: 50,
	maxFetchSize: spec.maxFetchSize || 300 * 1024
})

function payloads(messages) {
	return messages.map(function (m) { return m.payload.toString('base64') })
}

function offsets(topic, partitionId, time, max, cb) {
	var partition = topic.partition('0-' + partitionId)
	kafka.broker(0).client.offsets(topic, partition, time, max, function (err, length, result) {
		if (err) return fail('OFFSETS of ' + topic.name + '/' + partitionId + ': ' + err.message)
		cb(result)
	})
}

var ops = {
	consume: function () {
		var topic = kafka.topic(spec.topic, {
			partitions: { consume: ['0-' + spec.partition + ':' + spec.offset], produce: ['0:0'] }
		})
		var partition = topic.partition('0-' + spec.partition)
		var messages = []
		topic.on('error', function (err) { fail('consume: ' + err.message) })
		topic.on('data', function (data) {
			messages.push(data.toString('base64'))
			if (messages.length === spec.count) {
				topic.pause()
				done({ messages: messages, next: partition.offset })
			}
		})
		topic.resume()
	},

	produce: function () {
		var topic = kafka.topic(spec.topic, {
			partitions: { produce: ['0:' + (spec.partitions || 1)] }
		})
		topic.on('error', function (err) { fail('produce: ' + err.message) })
		var count = spec.partitions || 1
		var latest = function (cb) {
			var result = []
			var next = function (p) {
				if (p === count) return cb(result)
				offsets(topic, p, -1, 1, function (found) {
					result.push(found[0])
					next(p + 1)
				})
			}
			next(0)
		}
		latest(function (before) {
			spec.messages.forEach(function (m) { topic.write(Buffer.from(m, 'base64')) })
			var poll = function () {
				latest(function (after) {
					var moved = after.some(function (o, p) { return o !== before[p] })
					if (moved) return done({ before: before, latest: after })
					setTimeout(poll, 10)
				})
			}
			poll()
		})
	},

	offsets: function () {
		var topic = kafka.topic(spec.topic)
		offsets(topic, spec.partition, spec.time, spec.max, function (result) {
			done({ offsets: result })
		})
	},

	fetch: function () {
		var topic = kafka.topic(spec.topic)
		var partition = topic.partition('0-' + spec.partition)
		partition.offset = spec.offset
		partition.fetch(function (err, messages) {
			done({
				error: err ? err.message : null,
				messages: messages ? payloads(messages) : [],
				next: partition.offset
			})
		})
	}
}

if (!ops[spec.op]) fail('unknown op ' + spec.op)
kafka.connect(ops[spec.op])
