package redisbackend

// AlwaysPipeline makes b send every FCALL through the client's
// autopipeliner, a lone one too, as if another were out: for the tests of
// pipelined calls on faulty servers.
func AlwaysPipeline(b *Backend) { b.scripts.out.Add(1) }
