package produceracks

func useAllAcksInTests() {
	testedAcks = -1
}
