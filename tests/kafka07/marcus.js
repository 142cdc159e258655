// kafka 0.2.3 (npm, unmodified; Kafka's magic 0 messages) against kl serve: one
// operation per run, as franz.js.
//
//   consume  {topic, partition, offset, count}: Consumer.subscribeTopic
//            -> {messages, next}: the payloads (UTF-8 text: this client decodes them)
//               and the offset after the last one
//   produce  {topic, partition, messages}: Producer.send, then the connection is
//            closed: node exits once the request is written (PRODUCE has no
//            answer) -> {sent}
//   fetch    {topic, partition, offset}: one FETCH by Client.fetchTopic
//            -> {error, messages}: the error code's name (or code) or null
'use strict'
var kafka = require('kafka')

var spec = JSON.parse(process.argv[2])
var timer = setTimeout(function () {
	process.stderr.write('marcus.js: ' + spec.op + ' not done within ' + spec.timeout + ' ms\n')
	process.exit(2)
}, spec.timeout || 10000)

function done(result) {
	clearTimeout(timer)
	process.stdout.write(JSON.stringify(result) + '\n', function () { process.exit(0) })
}

function fail(message) {
	process.stderr.write('marcus.js: ' + message + '\n')
	process.exit(1)
}

var address = { host: '127.0.0.1', port: spec.port, pollInterval: 20 }

var ops = {
	consume: function () {
		var consumer = new kafka.Consumer(address)
		var messages = []
		consumer.on('error', function (code, name) { fail('consume: error ' + code + ' ' + name) })
		consumer.on('message', function (topic, message, offset) {
			messages.push(message)
			if (messages.length === spec.count) {
				done({ messages: messages, next: offset })
			}
		})
		consumer.connect(function () {
			consumer.subscribeTopic({ name: spec.topic, partition: spec.partition, offset: spec.offset })
		})
	},

	produce: function () {
		var producer = new kafka.Producer(address)
		producer.on('error', function (err) { fail('produce: ' + err) })
		producer.connect(function () {
			producer.send(spec.messages, spec.topic, spec.partition)
			producer.close()
			clearTimeout(timer)
			process.stdout.write(JSON.stringify({ sent: spec.messages.length }) + '\n')
		})
	},

	fetch: function () {
		var client = new kafka.Client(address)
		var messages = []
		var error = null
		client.on('error', function (code, name) { error = name || String(code) })
		client.on('message', function (topic, message) { messages.push(message) })
		client.on('lastmessage', function () { done({ error: error, messages: messages }) })
		client.connect(function () {
			client.fetchTopic({ name: spec.topic, partition: spec.partition, offset: spec.offset })
		})
	}
}

if (!ops[spec.op]) fail('unknown op ' + spec.op)
ops[spec.op]()
