module github.com/capledger/capledger

go 1.26.8
