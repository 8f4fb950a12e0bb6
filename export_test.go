package packcache

// Serializers the tests use that the package does not export: an
// application writes its own in a few lines.
var (
	StdJSON Serializer = jsonSerializer{}
	Gob     Serializer = gobSerializer{}
)
