package engines

import "slices"

// BuildNotification assembles the notification for the given plans (all writing to one destination node):
// their destination regions, sorted and unique, and their tags in plan order.
func BuildNotification(from string, plans []*Plan, payload []byte) Notification {
	n := Notification{From: from, Payload: payload}
	for _, p := range plans {
		n.Regions = append(n.Regions, p.Dst)
		n.Tags = append(n.Tags, p.Tags...)
	}
	slices.Sort(n.Regions)
	n.Regions = slices.Compact(n.Regions)
	return n
}

// AllSucceeded reports whether every outcome is a success.
func AllSucceeded(outcomes []Outcome) bool {
	for _, o := range outcomes {
		if o.Err != nil {
			return false
		}
	}
	return true
}
