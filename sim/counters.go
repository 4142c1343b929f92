package sim

// H6 fills this file: the counters and readings the metrics collectors scrape
// (temperature, power, utilisation, ECC, NVLink counters...).
func (n *Node) installCounters() {}
