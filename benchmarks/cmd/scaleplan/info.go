package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// info is the fields of an INFO reply.
type info map[string]string

// readInfo returns the fields of INFO's sections.
func readInfo(ctx context.Context, rdb *redis.Client, sections ...string) (info, error) {
	reply, err := rdb.Info(ctx, sections...).Result()
	if err != nil {
		return nil, fmt.Errorf("INFO %s: %w", strings.Join(sections, " "), err)
	}
	fields := info{}
	for line := range strings.SplitSeq(reply, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") {
			fields[k] = v
		}
	}
	return fields, nil
}

// number returns the field name as a number.
func (in info) number(name string) (float64, error) {
	v, ok := in[name]
	if !ok {
		return 0, fmt.Errorf("INFO has no %s", name)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("INFO %s: %w", name, err)
	}
	return f, nil
}

// commandStat returns a number of a command's line of INFO commandstats,
// such as the calls of fcall: cmdstat_fcall:calls=2,usec=15,...
func (in info) commandStat(command, name string) (float64, error) {
	v, ok := in["cmdstat_"+command]
	if !ok {
		return 0, fmt.Errorf("INFO commandstats has no %s (sluice calls its Redis Function on redis-server 7.0 or later)", command)
	}
	for kv := range strings.SplitSeq(v, ",") {
		if k, n, _ := strings.Cut(kv, "="); k == name {
			return strconv.ParseFloat(n, 64)
		}
	}
	return 0, fmt.Errorf("INFO cmdstat_%s has no %s", command, name)
}
