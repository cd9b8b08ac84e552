// Command hello is what testbinary's test builds and runs.
package main

import "fmt"

func main() { fmt.Println("hello") }
