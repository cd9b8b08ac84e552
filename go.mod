module github.com/capledger/capledger

go 1.26.8

require pgregory.net/rapid v1.3.0

require (
	connectrpc.com/connect v1.21.1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
